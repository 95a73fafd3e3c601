// Command ports measures port forwarding through kloud against a direct TCP connection to the
// same server, in the same run: throughput (MB/s sending -mb MB that the server counts) and
// latency (p50/p99 of 1-byte echo round trips) through the tunnel `kloud port-forward` opens
// (a WebSocket to kloud's /api/machines/ID/ports/PORT/tcp, relayed to a real klient process's
// port.connect), against a plain TCP connection to the server.
//
//	go run ./bench/ports [-mb 200] [-echoes 2000] [-runs 3]     (or bench/run.sh ports)
//
// kloud runs in its own process (this program re-executed), klient in its own, as in
// production; the "machine" is this host (klient with --root on a scratch dir), so the direct
// side is loopback, not a local machine's bridge: the ratio is what kloud's two WebSocket hops
// and relay cost over the same kernel path. There is no target in the issue: it prints the
// figures and the ratios.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/provider"
)

const (
	owner     = "bench"
	machineID = "bench-vm"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == "kloud-child" {
		if err := kloudChild(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "ports kloud:", err)
			os.Exit(2)
		}
		return
	}
	mb := flag.Int("mb", 200, "MB sent per throughput run")
	echoes := flag.Int("echoes", 2000, "1-byte round trips per side")
	runs := flag.Int("runs", 3, "throughput runs per side")
	flag.Parse()
	if err := run(*mb, *echoes, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "ports:", err)
		os.Exit(2)
	}
}

func run(mb, echoes, runs int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root, err := testutil.ModuleRoot()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "bench-ports-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	klientBin := filepath.Join(tmp, "klient")
	if out, err := exec.Command("go", "build", "-C", root, "-o", klientBin, "./cmd/klient").CombinedOutput(); err != nil {
		return fmt.Errorf("build klient: %w\n%s", err, out)
	}
	srv, err := startServer()
	if err != nil {
		return err
	}
	defer srv.Close()
	port := srv.Addr().(*net.TCPAddr).Port

	kdir := filepath.Join(tmp, "kloud")
	os.MkdirAll(kdir, 0o700)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	kcmd := exec.CommandContext(ctx, self, "kloud-child", kdir)
	kcmd.Stderr = os.Stderr
	kout, _ := kcmd.StdoutPipe()
	if err := kcmd.Start(); err != nil {
		return err
	}
	defer func() { kcmd.Process.Signal(os.Interrupt); kcmd.Wait() }()
	line, err := bufio.NewReader(kout).ReadString('\n')
	kloudURL, found := strings.CutPrefix(strings.TrimSpace(line), "READY ")
	if err != nil || !found {
		return fmt.Errorf("kloud child: %q %v", line, err)
	}
	session, err := os.ReadFile(filepath.Join(kdir, "session"))
	if err != nil {
		return err
	}
	mach := filepath.Join(tmp, "machine")
	os.MkdirAll(mach, 0o755)
	kl := exec.CommandContext(ctx, klientBin, "--kite-key", filepath.Join(kdir, "kite.key"), "--kontrol-url", kloudURL+"/kite",
		"--owner", owner, "--root", mach, "--state-dir", filepath.Join(tmp, "klient-state"))
	kl.Stderr = io.Discard
	if err := kl.Start(); err != nil {
		return err
	}
	defer func() { kl.Process.Signal(os.Interrupt); kl.Wait() }()

	wsURL := fmt.Sprintf("ws%s/api/machines/%s/ports/%d/tcp", strings.TrimPrefix(kloudURL, "http"), machineID, port)
	cred := strings.TrimSpace(string(session))
	viaKloud := func() (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(dctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + cred}}})
		if err != nil {
			return nil, err
		}
		return tunnel.New(ws, "bench"), nil
	}
	direct := func() (net.Conn, error) { return net.Dial("tcp", srv.Addr().String()) }
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := viaKloud()
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("klient did not register, or the tunnel fails: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	fmt.Printf("port forwarding: %d MB x %d runs, %d echoes; kloud → klient → 127.0.0.1:%d vs direct\n", mb, runs, echoes, port)
	size := int64(mb) * 1000 * 1000
	var tput [2][]float64
	for i := range runs {
		for side, dial := range []func() (net.Conn, error){direct, viaKloud} {
			d, err := throughput(dial, size)
			if err != nil {
				return fmt.Errorf("throughput run %d side %d: %w", i, side, err)
			}
			tput[side] = append(tput[side], float64(size)/1e6/d.Seconds())
		}
	}
	var lat [2][]time.Duration
	for side, dial := range []func() (net.Conn, error){direct, viaKloud} {
		if lat[side], err = latency(dial, echoes); err != nil {
			return fmt.Errorf("latency side %d: %w", side, err)
		}
	}
	best := func(v []float64) float64 { return slices.Max(v) }
	pct := func(d []time.Duration, p float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[int(float64(len(s)-1)*p)]
	}
	fmt.Printf("throughput (best of %d): direct %.0f MB/s, through kloud %.0f MB/s: ratio %.2f (runs: direct %.0f, kloud %.0f)\n",
		runs, best(tput[0]), best(tput[1]), best(tput[1])/best(tput[0]), tput[0], tput[1])
	fmt.Printf("latency p50: direct %s, through kloud %s: ratio %.1f; p99: direct %s, through kloud %s\n",
		pct(lat[0], .5), pct(lat[1], .5), float64(pct(lat[1], .5))/float64(pct(lat[0], .5)), pct(lat[0], .99), pct(lat[1], .99))
	return nil
}

// startServer serves two kinds of connection by their first byte: 'S' (sink: count what comes
// until EOF, answer the count as 8 bytes) and 'E' (echo every byte).
func startServer() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				kind := make([]byte, 1)
				if _, err := io.ReadFull(c, kind); err != nil {
					return
				}
				if kind[0] == 'E' {
					io.Copy(c, c)
					return
				}
				n, _ := io.Copy(io.Discard, c)
				binary.Write(c, binary.BigEndian, n)
			}()
		}
	}()
	return ln, nil
}

type halfCloser interface{ CloseWrite() error }

func throughput(dial func() (net.Conn, error), size int64) (time.Duration, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	t0 := time.Now()
	if _, err := c.Write([]byte{'S'}); err != nil {
		return 0, err
	}
	for sent := int64(0); sent < size; {
		n := min(int64(len(buf)), size-sent)
		if _, err := c.Write(buf[:n]); err != nil {
			return 0, err
		}
		sent += n
	}
	if err := c.(halfCloser).CloseWrite(); err != nil {
		return 0, err
	}
	var got int64
	if err := binary.Read(c, binary.BigEndian, &got); err != nil {
		return 0, err
	}
	d := time.Since(t0)
	if got != size {
		return 0, fmt.Errorf("the server counted %d bytes of %d", got, size)
	}
	return d, nil
}

func latency(dial func() (net.Conn, error), n int) ([]time.Duration, error) {
	c, err := dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := c.Write([]byte{'E'}); err != nil {
		return nil, err
	}
	b := []byte{0}
	out := make([]time.Duration, 0, n)
	for i := range n + 50 { // the first 50 warm up
		t0 := time.Now()
		b[0] = byte(i)
		if _, err := c.Write(b); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return nil, err
		}
		if b[0] != byte(i) {
			return nil, errors.New("echo: wrong byte")
		}
		if i >= 50 {
			out = append(out, time.Since(t0))
		}
	}
	return out, nil
}

// kloudChild is the kloud process: a machine record of owner's whose agent is the klient the
// parent starts with the kite key written here, and a session for owner.
func kloudChild(dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	s, err := kloud.New(ctx, kloud.Options{DataDir: dir, Addr: ln.Addr().String(), PublicURL: url, KlientBin: "/nonexistent",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	key, kiteID, err := s.Kontrol.CreateKey(owner, kloud.AgentKitePrefix+"bench")
	if err != nil {
		return err
	}
	if err := kitekey.WriteFile(filepath.Join(dir, "kite.key"), key); err != nil {
		return err
	}
	now := s.Store().Now()
	if err := s.Store().Machines().InsertMany(ctx, []kloud.Machine{{
		ID: machineID, StackID: "bench", Label: "bench", Provider: "none", Owner: owner, Team: kloud.DefaultTeam,
		State: provider.Running, KiteID: kiteID, CreatedAt: now, UpdatedAt: now,
	}}); err != nil {
		return err
	}
	sess, err := s.Signer().Session(owner, false, time.Hour)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "session"), []byte(sess), 0o600); err != nil {
		return err
	}
	fmt.Println("READY " + url)
	return s.ServeListener(ctx, ln)
}
