// Command ports measures port forwarding through kloud against a direct TCP connection to the
// same server, in the same run: throughput (MB/s sending -mb MB that the server counts) and
// latency (p50/p99 of 1-byte echo round trips) through the tunnel `kloud port-forward` opens
// (a WebSocket to kloud's /api/machines/ID/ports/PORT/tcp, relayed to a real klient process's
// port.connect), against a plain TCP connection to the server. Two comparisons (-on):
//
//   - bridge (issue 13's "vs a direct connection on the bridge"): the server and klient run in a
//     real local machine (providers/local's sandbox library: its own namespaces, veth and bridge,
//     booted from the base image); direct = this host → the machine's address on the bridge;
//     through kloud = this host → kloud (listening on the bridge's host address) → klient in
//     the machine → the server on the machine's loopback. Needs root, the base image
//     (sandbox.EnsureBaseImage) and iproute2/nsenter; without them it says so loudly and skips.
//
//   - loopback: the "machine" is this host (klient with --root on a scratch dir), the server on
//     127.0.0.1: the ratio is what kloud's two WebSocket hops and relay cost over the same
//     kernel path.
//
// kloud runs in its own process (this program re-executed, bench/internal/kloudchild), klient in
// its own, as in production. There is no target in the issue: it prints the figures, the ratios
// and the load average. Everything is removed at the end, also on an error or Ctrl-C.
//
//	set -a && . /var/cache/kloud/env && set +a && go run ./bench/ports [-on bridge,loopback] [-mb 200] [-echoes 2000] [-runs 3]
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/bench/internal/benchvm"
	"github.com/kloud-dev/kloud/bench/internal/kloudchild"
	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// serverPort is where the server listens in the local machine (bridge).
const serverPort = 7107

func main() {
	sandbox.MaybeRunInit() // a local machine's launcher and PID 1 are this binary
	kloudchild.MaybeRun()
	if len(os.Args) == 3 && os.Args[1] == "serve" { // the server, in the local machine
		ln, err := net.Listen("tcp", os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "ports serve:", err)
			os.Exit(2)
		}
		serve(ln)
		return
	}
	on := flag.String("on", "bridge,loopback", "comparisons to run: bridge (a local machine), loopback (this host)")
	mb := flag.Int("mb", 200, "MB sent per throughput run")
	echoes := flag.Int("echoes", 2000, "1-byte round trips per side")
	runs := flag.Int("runs", 3, "throughput runs per side")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, strings.Split(*on, ","), config{mb: *mb, echoes: *echoes, runs: *runs}); err != nil {
		fmt.Fprintln(os.Stderr, "ports:", err)
		os.Exit(2)
	}
}

type config struct {
	mb, echoes, runs int
	work, klient     string // the work directory (removed at the end) and the klient binary in it
}

func run(ctx context.Context, on []string, cfg config) (err error) {
	if cfg.work, err = os.MkdirTemp("/var/tmp", "kloud-bench-ports-"); err != nil {
		return err
	}
	defer os.RemoveAll(cfg.work)
	// klient as kloud serves it to machines (the base image is the host's Debian).
	cfg.klient = filepath.Join(cfg.work, "klient")
	root, err := testutil.ModuleRoot()
	if err != nil {
		return err
	}
	if err := kloudchild.GoBuild(root, cfg.klient, "./cmd/klient"); err != nil {
		return err
	}
	fmt.Printf("CPU: %s, %d vCPUs; load %s\n", measure.CPUModel(), runtime.NumCPU(), measure.LoadAvg())
	for _, what := range on {
		switch what {
		case "bridge":
			err = onBridge(ctx, cfg)
		case "loopback":
			err = onLoopback(ctx, cfg)
		default:
			err = fmt.Errorf("-on: %q is neither bridge nor loopback", what)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// onLoopback compares on this host: the server on 127.0.0.1, klient on the host.
func onLoopback(ctx context.Context, cfg config) error {
	tmp := filepath.Join(cfg.work, "loopback")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go serve(ln)
	kc, err := kloudchild.Start(ctx, filepath.Join(tmp, "kloud"), "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer kc.Stop()
	mach := filepath.Join(tmp, "machine")
	if err := os.MkdirAll(mach, 0o755); err != nil {
		return err
	}
	kl, err := kc.StartKlient(ctx, cfg.klient, mach, filepath.Join(tmp, "klient-state"))
	if err != nil {
		return err
	}
	defer kloudchild.StopProcess(kl)
	addr := ln.Addr().String()
	return compare(ctx, cfg, "loopback: kloud → klient → "+addr+" vs direct to "+addr, kc, ln.Addr().(*net.TCPAddr).Port, addr)
}

// onBridge compares with a real local machine: the server and klient run in it, kloud listens on
// the bridge's host address.
func onBridge(ctx context.Context, cfg config) (err error) {
	// What runs in the machine: klient and this program (its server); the base image is the
	// same Debian as the host's (scripts/base-image.sh).
	self, err := os.Executable()
	if err != nil {
		return err
	}
	const id = "bench-ports"
	vm, err := benchvm.Boot(ctx, benchvm.Options{ID: id, Work: filepath.Join(cfg.work, "bridge"), Bridge: "kdbp", Subnet: 160,
		Files: map[string]string{cfg.klient: "klient", self: "ports"}})
	var skip *benchvm.SkipError
	if errors.As(err, &skip) {
		fmt.Printf("SKIPPED bridge comparison: %v\n", err)
		return nil
	}
	if err != nil {
		return err
	}
	defer vm.Close()
	kc := vm.Kloud
	for _, cmd := range []string{
		fmt.Sprintf("/opt/bench/ports serve 0.0.0.0:%d", serverPort),
		fmt.Sprintf("/opt/bench/klient --kite-key /opt/bench/kite.key --kontrol-url %s/kite --owner %s", kc.URL, kloudchild.Owner),
	} {
		if err := vm.Background(ctx, cmd, "/var/log/bench-ports.log"); err != nil {
			return err
		}
	}
	direct := net.JoinHostPort(vm.Info.IP.String(), fmt.Sprint(serverPort))
	return compare(ctx, cfg, fmt.Sprintf("bridge %s: kloud → klient in machine %s → 127.0.0.1:%d vs direct to %s", vm.Subnet, id, serverPort, direct),
		kc, serverPort, direct)
}

// compare measures the server at port of kloud's machine through kloud, and at direct without it.
func compare(ctx context.Context, cfg config, what string, kc *kloudchild.Kloud, port int, direct string) error {
	wsURL := fmt.Sprintf("ws%s/api/machines/%s/ports/%d/tcp", strings.TrimPrefix(kc.URL, "http"), kloudchild.MachineID, port)
	viaKloud := func() (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ws, resp, err := websocket.Dial(dctx, wsURL, &websocket.DialOptions{HTTPHeader: tunnel.Header(http.Header{"Authorization": {"Bearer " + kc.Session}})})
		if err != nil {
			return nil, err
		}
		return tunnel.New(ws, "bench", resp.Header), nil // as `kloud port-forward` dials (kloud/cli/portforward.go)
	}
	dialDirect := func() (net.Conn, error) { return net.Dial("tcp", direct) }
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := viaKloud()
		if err == nil {
			// A tunnel to a port nothing listens on is refused on the first read or write.
			_, err = latency(func() (net.Conn, error) { return c, nil }, 1)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("klient did not register, the server is not up, or the tunnel fails: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	fmt.Printf("port forwarding, %s: %d MB x %d runs, %d echoes; load %s\n", what, cfg.mb, cfg.runs, cfg.echoes, measure.LoadAvg())
	size := int64(cfg.mb) * 1000 * 1000
	sides := []func() (net.Conn, error){dialDirect, viaKloud}
	var tput [2][]float64
	for i := range cfg.runs {
		for side, dial := range sides {
			d, err := throughput(dial, size)
			if err != nil {
				return fmt.Errorf("throughput run %d side %d: %w", i, side, err)
			}
			tput[side] = append(tput[side], float64(size)/1e6/d.Seconds())
		}
	}
	var lat [2][]time.Duration
	for side, dial := range sides {
		var err error
		if lat[side], err = latency(dial, cfg.echoes); err != nil {
			return fmt.Errorf("latency side %d: %w", side, err)
		}
	}
	best := func(v []float64) float64 { return slices.Max(v) }
	d, k := measure.Summarize(lat[0]), measure.Summarize(lat[1])
	fmt.Printf("throughput (best of %d): direct %.0f MB/s, through kloud %.0f MB/s: ratio %.2f (runs: direct %.0f, kloud %.0f)\n",
		cfg.runs, best(tput[0]), best(tput[1]), best(tput[1])/best(tput[0]), tput[0], tput[1])
	fmt.Printf("latency p50: direct %s, through kloud %s: ratio %.1f; p99: direct %s, through kloud %s; load %s\n",
		d.P50, k.P50, float64(k.P50)/float64(d.P50), d.P99, k.P99, measure.LoadAvg())
	return nil
}

// serve serves two kinds of connection on ln by their first byte: 'S' (sink: count what comes
// until EOF, answer the count as 8 bytes) and 'E' (echo every byte), until ln is closed.
func serve(ln net.Listener) {
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
