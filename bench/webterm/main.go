// Command webterm measures Kloud's web terminal against gotty on this machine, in the same run:
// keystroke echo latency (p50/p99) and bulk output throughput (`cat` of a 50 MB file), through
// kloud → klient (kloud's terminal endpoint, as the browser uses it, relaying the attachment of
// a real klient process) against gotty v1.5.0 (built from the module proxy in the tools module
// bench/webterm/gotty; its code is not in this repository); and klient's idle RSS.
//
//	go run ./bench/webterm [-keys 2000] [-runs 3] [-mb 50]     (or bench/run.sh webterm)
//
// Both sides run the same shell (bash --norc --noprofile -i, prompt "> ") as the same user on
// the same machine, and one client (coder/websocket) drives both, the two sides interleaved. Echo
// latency is from sending one keystroke to reading its echo (alternately 'a' and Backspace, so
// the line never grows); throughput is the file's size over the time from sending
// `cat FILE; echo DONE-$((40+2))` to reading DONE-42. kloud runs in its own process (this
// program re-executed), klient in its own, as in production.
//
// A third, diagnostic side ("klient direct") attaches to a second klient process without kloud:
// this process plays kontrol and the attach endpoint (direct.go), so the difference to
// kloud→klient is what kloud's relay costs, and the difference to gotty what klient itself does.
//
// Targets: p50 echo ≤ gotty's, throughput ≥ gotty's, klient idle RSS ≤ 20 MB. It prints the
// figures, the ratios and which targets were met, and exits 1 if one was missed.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/bench/internal/kloudchild"
	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/kloud"
)

const (
	owner     = kloudchild.Owner
	machineID = kloudchild.MachineID
	prompt    = "> "
)

func main() {
	kloudchild.MaybeRun()
	keys := flag.Int("keys", 2000, "measured keystrokes per side")
	runs := flag.Int("runs", 3, "bulk output runs per side")
	mb := flag.Int("mb", 50, "size of the file to cat, in MB")
	gottyBin := flag.String("gotty", "", "a gotty binary (default: build v1.5.0 from bench/webterm/gotty)")
	flag.Parse()
	ok, err := run(*keys, *runs, *mb, *gottyBin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "webterm:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(keys, runs, mb int, gottyBin string) (bool, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root, err := testutil.ModuleRoot()
	if err != nil {
		return false, err
	}
	tmp, err := os.MkdirTemp("", "bench-webterm-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	os.Chmod(tmp, 0o755)

	// Binaries: klient from this tree, gotty from its tools module.
	klientBin := filepath.Join(tmp, "klient")
	if err := kloudchild.GoBuild(root, klientBin, "./cmd/klient"); err != nil {
		return false, err
	}
	if gottyBin == "" {
		gottyBin = filepath.Join(tmp, "gotty")
		if err := kloudchild.GoBuild(filepath.Join(root, "bench/webterm/gotty"), gottyBin, "github.com/sorenisanerd/gotty"); err != nil {
			return false, err
		}
	}

	// The machine: an account whose login shell is bash without rc files, and the file to cat.
	mach := filepath.Join(tmp, "machine")
	shell := filepath.Join(tmp, "shell.sh")
	home := filepath.Join(tmp, "home")
	for _, d := range []string{filepath.Join(mach, "etc"), home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return false, err
		}
	}
	if err := os.WriteFile(shell, []byte("#!/bin/sh\nexec /bin/bash --norc --noprofile -i\n"), 0o755); err != nil {
		return false, err
	}
	uid := os.Geteuid()
	if err := os.WriteFile(filepath.Join(mach, "etc/passwd"), fmt.Appendf(nil, "%s:x:%d:%d::%s:%s\n", owner, uid, os.Getegid(), home, shell), 0o644); err != nil {
		return false, err
	}
	bulk := filepath.Join(tmp, "bulk.txt")
	size, err := writeBulk(bulk, int64(mb)*1000*1000)
	if err != nil {
		return false, err
	}

	// kloud (this program re-executed) and klient, each in its own process.
	kc, err := kloudchild.Start(ctx, filepath.Join(tmp, "kloud"), "127.0.0.1:0")
	if err != nil {
		return false, err
	}
	defer kc.Stop()
	kl, err := kc.StartKlient(ctx, klientBin, mach, filepath.Join(tmp, "klient-state"))
	if err != nil {
		return false, err
	}
	defer kloudchild.StopProcess(kl)
	// The diagnostic side: a second klient, attached to directly (no relay).
	dir, directKey, err := startDirect(tmp)
	if err != nil {
		return false, fmt.Errorf("direct: %w", err)
	}
	kl2 := exec.CommandContext(ctx, klientBin, "--kite-key", directKey, "--kontrol-url", dir.url+"/kite",
		"--owner", owner, "--root", mach, "--state-dir", filepath.Join(tmp, "klient2-state"))
	kl2.Stderr = io.Discard
	if err := kl2.Start(); err != nil {
		return false, err
	}
	defer func() { kl2.Process.Signal(os.Interrupt); kl2.Wait() }()
	if err := waitFor(ctx, 30*time.Second, dir.registered); err != nil {
		return false, fmt.Errorf("the second klient did not register: %w", err)
	}
	api := &kloudAPI{url: kc.URL, session: kc.Session}
	if err := waitFor(ctx, 30*time.Second, func() bool { _, err := api.sessions(ctx); return err == nil }); err != nil {
		return false, fmt.Errorf("klient did not register with kloud: %w", err)
	}
	time.Sleep(3 * time.Second) // let the just-started agent settle before sampling its idle memory
	idle0, err := measure.ReadProcStatus(kl.Process.Pid)
	if err != nil {
		return false, err
	}

	// gotty on a free port, writable, running the same shell.
	gport, err := freePort()
	if err != nil {
		return false, err
	}
	gcmd := exec.CommandContext(ctx, gottyBin, "--permit-write", "--address", "127.0.0.1", "--port", fmt.Sprint(gport), shell)
	gcmd.Stdout, gcmd.Stderr = io.Discard, io.Discard
	gcmd.Dir = home
	gcmd.Env = append(os.Environ(), "HOME="+home)
	if err := gcmd.Start(); err != nil {
		return false, err
	}
	defer func() { gcmd.Process.Kill(); gcmd.Wait() }()
	gottyURL := fmt.Sprintf("http://127.0.0.1:%d", gport)
	if err := waitFor(ctx, 30*time.Second, func() bool {
		resp, err := http.Get(gottyURL + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}); err != nil {
		return false, fmt.Errorf("gotty did not start: %w", err)
	}

	fmt.Printf("CPU: %s, %d vCPUs, %s/%s; load %s\n", measure.CPUModel(), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, measure.LoadAvg())
	fmt.Printf("klient idle RSS after registering: %s\n", measure.MiB(idle0.VmRSS))

	sides := []*side{
		{name: "kloud→klient", open: func(ctx context.Context) (term, error) { return api.open(ctx) }},
		{name: "gotty", open: func(ctx context.Context) (term, error) { return openGotty(ctx, gottyURL) }},
		{name: "klient direct", open: func(ctx context.Context) (term, error) { return dir.open(ctx) }},
	}
	for _, s := range sides {
		t, err := s.open(ctx)
		if err != nil {
			return false, fmt.Errorf("%s: %w", s.name, err)
		}
		s.t = t
		defer t.close()
		if err := ready(ctx, t); err != nil {
			return false, fmt.Errorf("%s: %w", s.name, err)
		}
	}

	// Echo: warm-up, then blocks of 100 keys alternating between the sides.
	for _, s := range sides {
		if _, err := echo(ctx, s.t, 100); err != nil {
			return false, fmt.Errorf("%s warm-up: %w", s.name, err)
		}
	}
	for done := 0; done < keys; done += 100 {
		n := min(100, keys-done)
		for _, s := range sides {
			d, err := echo(ctx, s.t, n)
			if err != nil {
				return false, fmt.Errorf("%s echo: %w", s.name, err)
			}
			s.echo = append(s.echo, d...)
		}
	}
	// Bulk output, interleaved.
	for range runs {
		for _, s := range sides {
			d, n, err := catFile(ctx, s.t, bulk)
			if err != nil {
				return false, fmt.Errorf("%s cat: %w", s.name, err)
			}
			s.cat = append(s.cat, d)
			s.catBytes = n
		}
	}
	peak, _ := measure.ReadProcStatus(kl.Process.Pid)
	gst, _ := measure.ReadProcStatus(gcmd.Process.Pid)
	for _, s := range sides {
		s.t.close()
	}
	// Idle again: the session ended, the agent waits.
	api.killAll(ctx)
	time.Sleep(3 * time.Second)
	idle1, _ := measure.ReadProcStatus(kl.Process.Pid)

	k, g := sides[0], sides[1]
	kl50, gl := measure.Summarize(k.echo), measure.Summarize(g.echo)
	kt, gt := mbps(size, measure.MedianDuration(k.cat)), mbps(size, measure.MedianDuration(g.cat))
	fmt.Printf("\nkeystroke echo (%d keys per side, 'a'/Backspace alternately):\n", len(k.echo))
	fmt.Printf("  %-13s p50 %s  p90 %s  p99 %s  max %s\n", k.name, measure.Ms(kl50.P50), measure.Ms(kl50.P90), measure.Ms(kl50.P99), measure.Ms(kl50.Max))
	fmt.Printf("  %-13s p50 %s  p90 %s  p99 %s  max %s\n", g.name, measure.Ms(gl.P50), measure.Ms(gl.P90), measure.Ms(gl.P99), measure.Ms(gl.Max))
	fmt.Printf("  ratio kloud/gotty: p50 %.2f×, p99 %.2f×\n", ratio(kl50.P50, gl.P50), ratio(kl50.P99, gl.P99))
	dl := measure.Summarize(sides[2].echo)
	fmt.Printf("  (diagnostic) %-13s p50 %s  p90 %s  p99 %s: klient alone, without kloud's relay\n", sides[2].name, measure.Ms(dl.P50), measure.Ms(dl.P90), measure.Ms(dl.P99))
	fmt.Printf("\nbulk output (cat of %.0f MB, %d runs per side, median):\n", float64(size)/1e6, runs)
	fmt.Printf("  %-13s %.2f MB/s  (runs %s; %d bytes on the wire after the tty's \\r\\n)\n", k.name, kt, durs(k.cat), k.catBytes)
	fmt.Printf("  %-13s %.2f MB/s  (runs %s)\n", g.name, gt, durs(g.cat))
	fmt.Printf("  ratio kloud/gotty: %.2f×\n", kt/gt)
	fmt.Printf("  (diagnostic) %-13s %.2f MB/s  (runs %s)\n", sides[2].name, mbps(size, measure.MedianDuration(sides[2].cat)), durs(sides[2].cat))
	fmt.Printf("\nklient RSS: idle after registering %s, peak %s, idle after the run %s (gotty after the run: %s)\n",
		measure.MiB(idle0.VmRSS), measure.MiB(peak.VmHWM), measure.MiB(idle1.VmRSS), measure.MiB(gst.VmRSS))

	ok := true
	check := func(name string, met bool) {
		verdict := "met"
		if !met {
			verdict, ok = "MISSED", false
		}
		fmt.Printf("target %-34s %s\n", name+":", verdict)
	}
	fmt.Println()
	check("p50 echo ≤ gotty", kl50.P50 <= gl.P50)
	check("throughput ≥ gotty", kt >= gt)
	check("klient idle RSS ≤ 20 MB", idle0.VmRSS <= 20<<20 && idle1.VmRSS <= 20<<20)
	return ok, nil
}

// writeBulk writes size bytes of printable lines (base64 of random bytes).
func writeBulk(path string, size int64) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	raw := make([]byte, 57)
	line := make([]byte, 77)
	var n int64
	for n < size {
		rand.Read(raw)
		base64.StdEncoding.Encode(line, raw)
		line[76] = '\n'
		k := min(int64(len(line)), size-n)
		w.Write(line[:k])
		n += k
	}
	return n, w.Flush()
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func mbps(size int64, d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }

func durs(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = fmt.Sprintf("%.2fs", d.Seconds())
	}
	return strings.Join(s, " ")
}

// side is one terminal server under test.
type side struct {
	name     string
	open     func(context.Context) (term, error)
	t        term
	echo     []time.Duration
	cat      []time.Duration
	catBytes int64
}

// term is a client of one terminal protocol.
type term interface {
	send(ctx context.Context, input []byte) error
	recv(ctx context.Context) ([]byte, error) // the next output, decoded
	close()
}

// ready sets a prompt without the letters the echo test looks for and waits for it.
func ready(ctx context.Context, t term) error {
	if err := t.send(ctx, []byte("PS1='"+prompt+"'; echo READY-$((1+1))\r")); err != nil {
		return err
	}
	_, _, err := until(ctx, t, "READY-2\r\n", prompt)
	return err
}

// until reads output until it has seen the markers, one after the other, and returns how many
// bytes it read and when it saw the first marker.
func until(ctx context.Context, t term, markers ...string) (int64, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var tail []byte
	var n int64
	var first time.Time
	want := len(markers)
	for len(markers) > 0 {
		b, err := t.recv(ctx)
		if err != nil {
			return n, first, err
		}
		n += int64(len(b))
		tail = append(tail, b...)
		for len(markers) > 0 {
			i := bytes.Index(tail, []byte(markers[0]))
			if i < 0 {
				break
			}
			tail = append(tail[:0], tail[i+len(markers[0]):]...)
			markers = markers[1:]
			if len(markers) == want-1 {
				first = time.Now()
			}
		}
		if len(markers) > 0 && len(tail) > len(markers[0]) {
			tail = append(tail[:0], tail[len(tail)-len(markers[0]):]...)
		}
	}
	return n, first, nil
}

// echo types n keys, alternately 'a' and Backspace, each timed until its echo arrives.
func echo(ctx context.Context, t term, n int) ([]time.Duration, error) {
	keys := [2]struct{ in, want byte }{{'a', 'a'}, {0x7f, '\b'}}
	out := make([]time.Duration, 0, n)
	for i := range n {
		k := keys[i%2]
		start := time.Now()
		if err := t.send(ctx, []byte{k.in}); err != nil {
			return nil, err
		}
		for {
			b, err := t.recv(ctx)
			if err != nil {
				return nil, err
			}
			if bytes.IndexByte(b, k.want) >= 0 {
				break
			}
		}
		out = append(out, time.Since(start))
	}
	if n%2 == 1 { // leave the line empty
		t.send(ctx, []byte{0x7f})
		t.recv(ctx)
	}
	return out, nil
}

// catFile times `cat file` until the marker after it, and waits for the prompt.
func catFile(ctx context.Context, t term, file string) (time.Duration, int64, error) {
	start := time.Now()
	if err := t.send(ctx, []byte("cat "+file+"; echo DONE-$((40+2))\r")); err != nil {
		return 0, 0, err
	}
	n, done, err := until(ctx, t, "DONE-42\r\n", prompt)
	return done.Sub(start), n, err
}

// kloudAPI is kloud's HTTP API as the browser uses it.
type kloudAPI struct{ url, session string }

func (a *kloudAPI) header() http.Header {
	return http.Header{"Cookie": {kloud.SessionCookie + "=" + a.session}}
}

func (a *kloudAPI) sessions(ctx context.Context) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", a.url+"/api/machines/"+machineID+"/sessions", nil)
	req.Header = a.header()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, errors.New(resp.Status)
	}
	return resp, nil
}

func (a *kloudAPI) killAll(ctx context.Context) {
	req, _ := http.NewRequestWithContext(ctx, "DELETE", a.url+"/api/machines/"+machineID+"/sessions/bench", nil)
	req.Header = a.header()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
}

type kloudTerm struct {
	ws  *websocket.Conn
	buf []byte
}

func (a *kloudAPI) open(ctx context.Context) (*kloudTerm, error) {
	h := a.header()
	h.Set("Origin", a.url)
	ws, _, err := websocket.Dial(ctx, a.url+"/api/machines/"+machineID+"/terminal?session=bench&cols=120&rows=40", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(webterm.MaxFrame)
	return &kloudTerm{ws: ws, buf: make([]byte, 0, 1024)}, nil
}

func (k *kloudTerm) send(ctx context.Context, p []byte) error {
	k.buf = append(append(k.buf[:0], webterm.OpInput), p...)
	return k.ws.Write(ctx, websocket.MessageBinary, k.buf)
}

func (k *kloudTerm) recv(ctx context.Context) ([]byte, error) {
	for {
		typ, b, err := k.ws.Read(ctx)
		if err != nil || typ == websocket.MessageBinary {
			return b, err
		}
	}
}

func (k *kloudTerm) close() { k.ws.Close(websocket.StatusNormalClosure, "") }

// gottyTerm speaks gotty's "webtty" protocol: a JSON init message, then '1'+input text frames
// in, '1'+base64 output frames out (other message types are ignored).
type gottyTerm struct {
	ws  *websocket.Conn
	buf []byte
	dec []byte
}

func openGotty(ctx context.Context, base string) (*gottyTerm, error) {
	ws, _, err := websocket.Dial(ctx, base+"/ws", &websocket.DialOptions{Subprotocols: []string{"webtty"}})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(1 << 20)
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"Arguments":"","AuthToken":""}`)); err != nil {
		return nil, err
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte(`3{"columns":120,"rows":40}`)); err != nil {
		return nil, err
	}
	return &gottyTerm{ws: ws}, nil
}

func (g *gottyTerm) send(ctx context.Context, p []byte) error {
	g.buf = append(append(g.buf[:0], '1'), p...)
	return g.ws.Write(ctx, websocket.MessageText, g.buf)
}

func (g *gottyTerm) recv(ctx context.Context) ([]byte, error) {
	for {
		_, b, err := g.ws.Read(ctx)
		if err != nil {
			return nil, err
		}
		if len(b) == 0 || b[0] != '1' {
			continue
		}
		g.dec = slices.Grow(g.dec[:0], base64.StdEncoding.DecodedLen(len(b)-1))[:base64.StdEncoding.DecodedLen(len(b)-1)]
		n, err := base64.StdEncoding.Decode(g.dec, b[1:])
		if err != nil {
			return nil, fmt.Errorf("gotty output: %w", err)
		}
		return g.dec[:n], nil
	}
}

func (g *gottyTerm) close() { g.ws.Close(websocket.StatusNormalClosure, "") }
