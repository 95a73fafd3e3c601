// Package p2 measures kontrol with 10,000 simulated kites registered at once (issue 2,
// "Measure", P2), inside a real `kloud serve` process, against a raw WebSocket baseline in the
// same run.
//
// Start with Run. It builds (or takes) the kloud binary and starts `kloud serve` with a temp
// data dir as a child process, so the server's memory can be read alone from /proc; this process
// is the load generator. Then:
//
//  1. Baseline (Options.Raw): a trivial coder/websocket echo server in a process of its own
//     (ServeRaw, bench/cmd/p2 -serve-raw); Kites connections opened with Dialers at a time, each
//     with one echo round trip. This is the ceiling of the connection rate on this machine.
//  2. Kite keys for Kites simulated kites are minted by kontrol.createKey on a connection made
//     with the admin key from the data dir (before, and not timed with, the registrations).
//  3. Registration: each simulated kite is its own kite.Kite; it dials /kite, handshakes with its
//     kite key and calls kontrol.register, Dialers at a time. Registrations/s is the number of
//     kites over the wall time from the first dial to the last register reply.
//  4. The kloud process's VmRSS and VmHWM (/proc/<pid>/status) with every kite connected.
//  5. Queries: kontrol.query {query:{id}} for Queries ids, one after another on the admin
//     connection; each must return exactly that kite.
//
// RunReplicas (replicas.go) is the same across several `kloud serve --replicas` on one `kloud
// store serve` (issue 24): kites spread round robin, queries asked on a replica that does not
// hold the kite, memory per replica, then one replica SIGKILLed and the time until its kites are
// registered on the others. Its kites have machine agent keys signed with the replicas' shared
// signing key (the store), since only agents are visible across replicas.
//
// Every process it starts is stopped by its pid when Run returns, on failure too (and dies with
// this one: Pdeathsig).
package p2

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kontrol"
)

// Targets of issue 2.
const (
	TargetRegistrationsPerS = 2000
	TargetQueryP99          = 5 * time.Millisecond
	TargetRSS               = 100 << 20 // bytes; "< 100 MB" read as MiB, the stricter of the two is 100e6
)

// adminKeyFile is kloud.AdminKeyFile: P2 treats kloud as a black box, a binary, its data dir and
// the protocol, so it does not link package kloud.
const adminKeyFile = "admin.key"

// Options configure Run. Zero fields take the documented defaults.
type Options struct {
	// Kloud is the kloud binary to run; "" builds ./cmd/kloud (go build, from the current
	// directory's module) into the temp dir.
	Kloud string
	// Self is this program, run with -serve-raw for the baseline server ("" = os.Executable).
	Self     string
	Kites    int  // simulated kites (default 10000)
	Dialers  int  // connections being opened at once (default 200)
	Queries  int  // kontrol.query calls timed (default 10000)
	Raw      bool // run the raw WebSocket baseline first
	TempDir  string
	Keep     bool      // keep the temp dir (data dir, logs)
	Progress io.Writer // one line per step (nil = none)
	// Server is what serves the kites: ServerBinary (default) runs `kloud serve` from Kloud;
	// ServerKloud builds and runs bench/cmd/p2kloud (package kloudserver: kloud.New in process
	// plus pprof); ServerKontrol runs Self -serve-kontrol (ServeKontrol: kite and kontrol alone,
	// plus pprof).
	Server string
	// Profile, with ServerKloud or ServerKontrol, is a directory for the server's CPU profile
	// during the registrations and its heap and goroutine profiles with every kite connected;
	// runtime.MemStats before and after go into the report.
	Profile string
	// RegisterTimeout bounds the registration phase (default 3m): kites not registered by then
	// count as failed, so a server that cannot keep up gives a result instead of a hang.
	RegisterTimeout time.Duration
	// Replicas, for RunReplicas, is how many `kloud serve --replicas` share one `kloud store
	// serve` (default 3); FailoverTimeout bounds the wait for the killed replica's kites to be
	// registered again elsewhere (default 3m).
	Replicas        int
	FailoverTimeout time.Duration
	// KiteKeys, for RunReplicas, gives the kites kontrol.createKey kite keys instead of machine
	// agent keys (which the replicas' presence records, and so kontrol.query across them, need).
	KiteKeys bool
}

// Servers of Options.Server.
const (
	ServerBinary  = "binary"
	ServerKloud   = "kloud"
	ServerKontrol = "kontrol"
)

func (o *Options) setDefaults() {
	if o.Kites <= 0 {
		o.Kites = 10000
	}
	if o.Dialers <= 0 {
		o.Dialers = 200
	}
	if o.Queries <= 0 {
		o.Queries = 10000
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Server == "" {
		o.Server = ServerBinary
	}
	if o.RegisterTimeout <= 0 {
		o.RegisterTimeout = 3 * time.Minute
	}
}

// Phase is a timed fan-out of connections.
type Phase struct {
	OK, Failed int
	FirstErr   string
	Wall       time.Duration
	Lat        measure.Latency // per connection (dial to reply)
}

// PerSecond is successes per second of wall time.
func (p Phase) PerSecond() float64 {
	if p.Wall <= 0 {
		return 0
	}
	return float64(p.OK) / p.Wall.Seconds()
}

func phase(r connectResult) Phase {
	p := Phase{OK: r.ok, Failed: r.failed, Wall: r.wall, Lat: measure.Summarize(r.lat)}
	if r.firstErr != nil {
		p.FirstErr = r.firstErr.Error()
	}
	return p
}

// Report is the outcome of Run.
type Report struct {
	Opts Options

	Raw    *Phase             // nil without Options.Raw
	RawRSS measure.ProcStatus // raw server with every connection open
	RawIdl measure.ProcStatus // raw server before the first connection
	// RawCPU and RawGenCPU are the raw server's and this process's CPU time during the raw phase.
	RawCPU, RawGenCPU time.Duration
	Mint              time.Duration      // minting the kite keys (not part of Register)
	Reg               Phase              // kite registrations
	RegCPU            time.Duration      // the server's CPU time during the registrations
	GenCPU            time.Duration      // the load generator's (this process's) CPU time during them
	Query             measure.Latency    // kontrol.query by id
	QueryN            int                // queries that returned exactly the kite asked for
	Idle              measure.ProcStatus // kloud before the first kite
	Loaded            measure.ProcStatus // kloud right after the last registration
	Alive             int                // registered kites whose connection was still up at that moment
	// QueryErr says why the queries stopped early, if they did.
	QueryErr string
	After    measure.ProcStatus // kloud after the queries
	Kloud    string             // the binary
	// With Options.Profile: the server's runtime.MemStats before the first kite and with all.
	MemIdle, MemLoaded *MemStats
	Load               [2]string // /proc/loadavg before and after
	Start              time.Time
	Took               time.Duration
}

// Run runs P2.
func Run(ctx context.Context, opts Options) (rep *Report, err error) {
	opts.setDefaults()
	rep = &Report{Opts: opts, Start: time.Now()}
	rep.Load[0] = measure.LoadAvg()
	say := func(format string, args ...any) { fmt.Fprintf(opts.Progress, format+"\n", args...) }
	tmp, err := os.MkdirTemp(opts.TempDir, "kloud-bench-p2-")
	if err != nil {
		return nil, fmt.Errorf("p2: %w", err)
	}
	if opts.Keep {
		say("temp dir (kept): %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}

	if opts.Self == "" {
		if opts.Self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("p2: %w", err)
		}
	}
	switch opts.Server {
	case ServerBinary:
		if opts.Profile != "" {
			return nil, fmt.Errorf("p2: a profile needs the server in process (-server %s or %s)", ServerKloud, ServerKontrol)
		}
		rep.Kloud = opts.Kloud
		if opts.Kloud == "" {
			opts.Kloud = filepath.Join(tmp, "kloud")
			say("building ./cmd/kloud")
			out, err := exec.CommandContext(ctx, "go", "build", "-o", opts.Kloud, "github.com/kloud-dev/kloud/cmd/kloud").CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("p2: go build ./cmd/kloud (run from the repository): %w\n%s", err, out)
			}
			rep.Kloud = "./cmd/kloud built from " + gitDescribe(ctx)
		}
	case ServerKloud:
		opts.Kloud = filepath.Join(tmp, "p2kloud")
		say("building ./bench/cmd/p2kloud")
		out, err := exec.CommandContext(ctx, "go", "build", "-o", opts.Kloud, "github.com/kloud-dev/kloud/bench/cmd/p2kloud").CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("p2: go build ./bench/cmd/p2kloud (run from the repository): %w\n%s", err, out)
		}
		rep.Kloud = "kloud.New in process with pprof (bench/cmd/p2kloud), " + gitDescribe(ctx)
	case ServerKontrol:
		rep.Kloud = "kite + kontrol alone in process with pprof (p2 -serve-kontrol), " + gitDescribe(ctx)
	default:
		return nil, fmt.Errorf("p2: unknown server %q", opts.Server)
	}
	if opts.Profile != "" {
		if err := os.MkdirAll(opts.Profile, 0o755); err != nil {
			return nil, fmt.Errorf("p2: %w", err)
		}
	}

	if opts.Raw {
		if err := runRaw(ctx, opts, tmp, rep, say); err != nil {
			return nil, err
		}
	}

	// kloud serve
	dataDir := filepath.Join(tmp, "data")
	srv, addr, err := startKloud(ctx, opts, dataDir, tmp)
	if err != nil {
		return nil, err
	}
	var prof *profiler
	if opts.Server != ServerBinary {
		prof = &profiler{base: "http://" + addr, dir: opts.Profile, hc: &http.Client{}}
	}
	defer srv.stop(15 * time.Second)
	url := "http://" + addr + "/kite"
	say("kloud serve pid %d on %s", srv.Pid(), addr)
	if rep.Idle, err = measure.ReadProcStatus(srv.Pid()); err != nil {
		return nil, err
	}

	admin, ac, err := adminConn(ctx, url, filepath.Join(dataDir, adminKeyFile))
	if err != nil {
		return nil, err
	}
	defer admin.Close()

	// Kite keys, minted before the registrations start (not timed with them).
	t0 := time.Now()
	keys, ids, err := mintKeys(ctx, []*kite.Conn{ac}, opts.Kites)
	if err != nil {
		return nil, err
	}
	rep.Mint = time.Since(t0)
	say("minted %d kite keys in %s", len(keys), rep.Mint.Round(time.Millisecond))

	if prof != nil {
		ms, err := prof.memStats(ctx)
		if err != nil {
			return nil, err
		}
		rep.MemIdle = &ms
	}
	if opts.Profile != "" {
		if err := prof.get(ctx, "/debug/bench/cpu/start?file="+filepath.Join(opts.Profile, "cpu-register.pprof"), io.Discard); err != nil {
			return nil, err
		}
	}

	// Registrations.
	kites := make([]*kite.Kite, opts.Kites)
	defer closeKites(kites)
	cpu0, err := measure.ProcCPUTime(srv.Pid())
	if err != nil {
		return nil, err
	}
	gen0 := measure.CPUTime()
	rctx, cancel := context.WithTimeout(ctx, opts.RegisterTimeout)
	defer cancel()
	reg := fanOut(rctx, opts.Kites, opts.Dialers, func(ctx context.Context, i int) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "sim", ID: ids[i], Username: "sim"}})
		if err != nil {
			return err
		}
		kites[i] = k
		c, err := k.Dial(ctx, url, kite.Auth{Type: kite.AuthKiteKey, Key: keys[i]})
		if err != nil {
			return err
		}
		var res kontrol.RegisterResult
		if err := c.Call(ctx, "kontrol.register", kontrol.RegisterParams{}, &res); err != nil {
			return err
		}
		if res.Kite.Kite.ID != ids[i] {
			return fmt.Errorf("registered as %q, want %q", res.Kite.Kite.ID, ids[i])
		}
		return nil
	})
	rep.Reg = phase(reg)
	if left := opts.Kites - reg.ok - reg.failed; left > 0 {
		rep.Reg.Failed += left
		if rep.Reg.FirstErr == "" {
			rep.Reg.FirstErr = fmt.Sprintf("%d kites not tried within %s", left, opts.RegisterTimeout)
		}
	}
	cpu1, err := measure.ProcCPUTime(srv.Pid())
	if err != nil {
		return nil, err
	}
	rep.RegCPU = cpu1 - cpu0
	rep.GenCPU = measure.CPUTime() - gen0
	if rep.Loaded, err = measure.ReadProcStatus(srv.Pid()); err != nil {
		return nil, err
	}
	rep.Alive = alive(kites)
	say("registered %d kites (%d failed) in %s: %.0f/s; kloud VmRSS %s VmHWM %s",
		rep.Reg.OK, rep.Reg.Failed, rep.Reg.Wall.Round(time.Millisecond), rep.Reg.PerSecond(),
		measure.MiB(rep.Loaded.VmRSS), measure.MiB(rep.Loaded.VmHWM))
	if rep.Reg.Failed > 0 {
		say("first registration error: %s", rep.Reg.FirstErr)
	}
	if prof != nil {
		ms, err := prof.memStats(ctx)
		if err != nil {
			return nil, err
		}
		rep.MemLoaded = &ms
	}
	if opts.Profile != "" {
		if err := prof.get(ctx, "/debug/bench/cpu/stop", io.Discard); err != nil {
			return nil, err
		}
		for _, f := range []struct{ path, file string }{
			{"/debug/pprof/heap?gc=1", "heap.pprof"},
			{"/debug/pprof/goroutine?debug=1", "goroutines.txt"},
		} {
			if err := prof.save(ctx, f.path, filepath.Join(opts.Profile, f.file)); err != nil {
				return nil, err
			}
		}
		say("profiles in %s", opts.Profile)
	}

	// Queries by id on one admin connection.
	if err := runQueries(ctx, ac, kites, ids, opts.Queries, rep); err != nil {
		rep.QueryErr = err.Error()
		say("queries stopped: %s", err)
	}
	say("%d queries by id: p50 %s p99 %s", rep.Query.N, measure.Ms(rep.Query.P50), measure.Ms(rep.Query.P99))
	if rep.After, err = measure.ReadProcStatus(srv.Pid()); err != nil {
		return nil, err
	}
	if !srv.running() {
		return nil, fmt.Errorf("p2: kloud serve exited during the run: %w\n%s", srv.exitErr(), readLogTail(srv.log.Name(), 2000))
	}
	rep.Load[1] = measure.LoadAvg()
	rep.Took = time.Since(rep.Start)
	return rep, nil
}

func runRaw(ctx context.Context, opts Options, tmp string, rep *Report, say func(string, ...any)) error {
	self := opts.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return fmt.Errorf("p2: %w", err)
		}
	}
	raw, err := startProc("raw server", self, []string{"-serve-raw"}, filepath.Join(tmp, "raw.log"))
	if err != nil {
		return err
	}
	defer raw.stop(5 * time.Second)
	line, err := raw.waitLine(ctx, "listening on ", 30*time.Second)
	if err != nil {
		return err
	}
	addr := strings.TrimPrefix(line, "listening on ")
	if rep.RawIdl, err = measure.ReadProcStatus(raw.Pid()); err != nil {
		return err
	}
	cpu0, err := measure.ProcCPUTime(raw.Pid())
	if err != nil {
		return err
	}
	gen0 := measure.CPUTime()
	res, conns := rawConnect(ctx, "ws://"+addr+"/", opts.Kites, opts.Dialers)
	defer closeRaw(conns)
	rep.RawGenCPU = measure.CPUTime() - gen0
	cpu1, err := measure.ProcCPUTime(raw.Pid())
	if err != nil {
		return err
	}
	rep.RawCPU = cpu1 - cpu0
	p := phase(res)
	rep.Raw = &p
	if rep.RawRSS, err = measure.ReadProcStatus(raw.Pid()); err != nil {
		return err
	}
	say("raw: %d connections (%d failed) in %s: %.0f/s; server VmRSS %s", p.OK, p.Failed,
		p.Wall.Round(time.Millisecond), p.PerSecond(), measure.MiB(rep.RawRSS.VmRSS))
	return nil
}

// startKloud starts `kloud serve` on a free loopback port (kloud takes no port 0) and waits until
// it listens; a port taken between choosing and binding makes it try again. The in-process
// servers (p2kloud, Self -serve-kontrol) pick their own ports.
func startKloud(ctx context.Context, opts Options, dataDir, tmp string) (*proc, string, error) {
	tf := false
	if opts.Server == ServerBinary {
		help, _ := exec.CommandContext(ctx, opts.Kloud, "serve", "--help").CombinedOutput()
		tf = strings.Contains(string(help), "--terraformer-url")
	}
	var lastErr error
	for attempt := range 3 {
		bin, args := opts.Self, []string{"-serve-kontrol", "-data-dir", dataDir}
		switch opts.Server {
		case ServerKloud:
			bin, args = opts.Kloud, []string{"-data-dir", dataDir}
		case ServerBinary:
			addr, err := freePort()
			if err != nil {
				return nil, "", err
			}
			bin, args = opts.Kloud, []string{"serve", "--data-dir", dataDir, "--addr", addr}
			if tf {
				// Terraformer is not part of P2: point kloud at a port nothing listens on rather
				// than have it start one (its client keeps retrying in the background).
				tfAddr, err := freePort()
				if err != nil {
					return nil, "", err
				}
				args = append(args, "--terraformer-url", "http://"+tfAddr+"/kite")
			}
		}
		p, err := startProc("kloud serve", bin, args, filepath.Join(tmp, fmt.Sprintf("kloud-%d.log", attempt)))
		if err != nil {
			return nil, "", err
		}
		line, err := p.waitLine(ctx, "kloud ", 2*time.Minute)
		if err != nil {
			p.stop(5 * time.Second)
			lastErr = err
			continue
		}
		_, addr, ok := strings.Cut(line, " listening on ")
		if !ok {
			p.stop(5 * time.Second)
			return nil, "", fmt.Errorf("p2: kloud printed %q, want \"kloud VERSION listening on ADDR\"", line)
		}
		return p, strings.TrimSpace(addr), nil
	}
	return nil, "", fmt.Errorf("p2: %w", lastErr)
}

// freePort returns a loopback address nothing listens on at the moment.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("p2: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// adminConn dials kloud with the admin kite key from its data dir.
func adminConn(ctx context.Context, url, adminKeyPath string) (*kite.Kite, *kite.Conn, error) {
	key, err := kitekey.ReadFile(adminKeyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("p2: admin key: %w", err)
	}
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "bench-admin"}})
	if err != nil {
		return nil, nil, err
	}
	c, err := k.Dial(ctx, url, kite.Auth{Type: kite.AuthKiteKey, Key: key})
	if err != nil {
		k.Close()
		return nil, nil, fmt.Errorf("p2: admin dial: %w", err)
	}
	return k, c, nil
}

// mintKeys has kontrol mint n kite keys for user "sim" (kontrol.createKey on the admin
// connections, key i on cs[i%len(cs)], 8 calls at a time per connection). It goes through the
// protocol rather than the keyring because where kloud keeps its signing keys is its own
// business (a file, then the store).
func mintKeys(ctx context.Context, cs []*kite.Conn, n int) (keys, ids []string, err error) {
	keys, ids = make([]string, n), make([]string, n)
	res := fanOut(ctx, n, 8*len(cs), func(ctx context.Context, i int) error {
		var r kontrol.CreateKeyResult
		if err := cs[i%len(cs)].Call(ctx, "kontrol.createKey", kontrol.CreateKeyParams{Username: "sim"}, &r); err != nil {
			return fmt.Errorf("kontrol.createKey: %w", err)
		}
		keys[i], ids[i] = r.Key, r.KiteID
		return nil
	})
	if res.failed > 0 {
		return nil, nil, fmt.Errorf("p2: mint %d kite keys: %d failed: %w", n, res.failed, res.firstErr)
	}
	return keys, ids, nil
}

func runQueries(ctx context.Context, c *kite.Conn, kites []*kite.Kite, ids []string, n int, rep *Report) error {
	query := func(id string) error {
		var res kontrol.QueryResult
		if err := c.Call(ctx, "kontrol.query", kontrol.QueryParams{Query: kite.Identity{ID: id}}, &res); err != nil {
			return fmt.Errorf("p2: kontrol.query %s: %w", id, err)
		}
		if len(res.Kites) != 1 || res.Kites[0].Kite.ID != id {
			return fmt.Errorf("p2: kontrol.query %s: %d kites: %w", id, len(res.Kites), errNotOne)
		}
		return nil
	}
	// Only kites still connected can be found: a kite kontrol dropped (on an overloaded server,
	// for missed heartbeats) is not an error of the query.
	var live []string
	for i, k := range kites {
		if k != nil && len(k.Conns()) > 0 {
			live = append(live, ids[i])
		}
	}
	if len(live) == 0 {
		return errors.New("p2: no kite is connected to query for")
	}
	for i := range min(1000, len(live)) { // warm up
		if err := query(live[i]); err != nil {
			return err
		}
	}
	d := make([]time.Duration, 0, n)
	defer func() { rep.Query = measure.Summarize(d) }()
	for i := range n {
		t0 := time.Now()
		if err := query(live[i%len(live)]); err != nil {
			return err
		}
		d = append(d, time.Since(t0))
		rep.QueryN++
	}
	return nil
}

// alive counts the kites whose connection is up.
func alive(kites []*kite.Kite) int {
	n := 0
	for _, k := range kites {
		if k != nil && len(k.Conns()) > 0 {
			n++
		}
	}
	return n
}

// gitDescribe names the commit of the working tree ("abc1234", "+dirty" if it has changes).
func gitDescribe(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty=+dirty", "--abbrev=10").Output()
	if err != nil {
		return "an unknown commit"
	}
	return "commit " + strings.TrimSpace(string(out))
}

// closeKites closes the simulated kites, many at once.
func closeKites(kites []*kite.Kite) {
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	for _, k := range kites {
		if k == nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			k.Close()
		})
	}
	wg.Wait()
}

// Pass reports whether every target is met.
func (r *Report) Pass() bool {
	return r.Reg.Failed == 0 && r.Reg.PerSecond() >= TargetRegistrationsPerS && r.QueryErr == "" &&
		r.Query.P99 < TargetQueryP99 && r.Loaded.VmHWM < TargetRSS && r.After.VmRSS < TargetRSS
}

// Write prints the figures, the baseline and the ratios.
func (r *Report) Write(w io.Writer) {
	ok := func(b bool) string {
		if b {
			return "ok"
		}
		return "MISSED"
	}
	perKite := func(d time.Duration) time.Duration { return d / time.Duration(max(r.Reg.OK, 1)) }
	fmt.Fprintf(w, "P2: kontrol with %d simulated kites registered at once, %d dialing at a time\n", r.Opts.Kites, r.Opts.Dialers)
	fmt.Fprintf(w, "    server: %s\n", r.Kloud)
	fmt.Fprintf(w, "    %s, %d CPUs, %s; load generator and server share the machine; load average before %s, after %s\n",
		measure.CPUModel(), runtime.NumCPU(), runtime.Version(), r.Load[0], r.Load[1])
	if r.Raw != nil {
		fmt.Fprintf(w, "raw ws connect + 1 echo        %6d ok %5d failed in %9s = %6.0f conn/s   per conn p50 %s p99 %s\n",
			r.Raw.OK, r.Raw.Failed, r.Raw.Wall.Round(time.Millisecond), r.Raw.PerSecond(), measure.Ms(r.Raw.Lat.P50), measure.Ms(r.Raw.Lat.P99))
		perConn := func(d time.Duration) time.Duration { return d / time.Duration(max(r.Raw.OK, 1)) }
		fmt.Fprintf(w, "    CPU: raw server %s per conn, load generator %s per conn\n", measure.Us(perConn(r.RawCPU)), measure.Us(perConn(r.RawGenCPU)))
		fmt.Fprintf(w, "    raw server VmRSS idle %s, with %d conns %s (VmHWM %s): %.1f KiB per conn\n",
			measure.MiB(r.RawIdl.VmRSS), r.Raw.OK, measure.MiB(r.RawRSS.VmRSS), measure.MiB(r.RawRSS.VmHWM),
			float64(r.RawRSS.VmRSS-r.RawIdl.VmRSS)/1024/float64(max(r.Raw.OK, 1)))
	}
	fmt.Fprintf(w, "kite dial+handshake+register   %6d ok %5d failed in %9s = %6.0f reg/s    per kite p50 %s p99 %s   target ≥ %d: %s\n",
		r.Reg.OK, r.Reg.Failed, r.Reg.Wall.Round(time.Millisecond), r.Reg.PerSecond(), measure.Ms(r.Reg.Lat.P50), measure.Ms(r.Reg.Lat.P99),
		TargetRegistrationsPerS, ok(r.Reg.Failed == 0 && r.Reg.PerSecond() >= TargetRegistrationsPerS))
	if r.Reg.Failed > 0 {
		fmt.Fprintf(w, "    first error: %s\n", r.Reg.FirstErr)
	}
	if r.Raw != nil {
		fmt.Fprintf(w, "    registrations/s ÷ raw connections/s = %.2f\n", r.Reg.PerSecond()/r.Raw.PerSecond())
	}
	fmt.Fprintf(w, "    CPU during the registrations: server %s = %s per kite, load generator %s = %s per kite (2 CPUs give %s per second)\n",
		r.RegCPU.Round(10*time.Millisecond), measure.Us(perKite(r.RegCPU)), r.GenCPU.Round(10*time.Millisecond), measure.Us(perKite(r.GenCPU)),
		time.Duration(runtime.NumCPU())*time.Second)
	fmt.Fprintf(w, "    minting the keys (kontrol.createKey) took %s, not counted\n", r.Mint.Round(time.Millisecond))
	fmt.Fprintf(w, "kontrol.query by id            %6d calls on one connection: p50 %s p90 %s p99 %s max %s   target p99 < %s: %s\n",
		r.Query.N, measure.Ms(r.Query.P50), measure.Ms(r.Query.P90), measure.Ms(r.Query.P99), measure.Ms(r.Query.Max),
		measure.Ms(TargetQueryP99), ok(r.QueryErr == "" && r.Query.P99 < TargetQueryP99))
	if r.QueryErr != "" {
		fmt.Fprintf(w, "    stopped early: %s\n", r.QueryErr)
	}
	fmt.Fprintf(w, "server RSS                     idle %s; after the registrations (%d kites connected) VmRSS %s VmHWM %s; after the queries VmRSS %s VmHWM %s   target < %s: %s\n",
		measure.MiB(r.Idle.VmRSS), r.Alive, measure.MiB(r.Loaded.VmRSS), measure.MiB(r.Loaded.VmHWM),
		measure.MiB(r.After.VmRSS), measure.MiB(r.After.VmHWM), measure.MiB(TargetRSS), ok(r.Loaded.VmHWM < TargetRSS && r.After.VmRSS < TargetRSS))
	fmt.Fprintf(w, "    %.1f KiB per connected kite above idle (VmRSS); %d threads\n",
		float64(r.Loaded.VmRSS-r.Idle.VmRSS)/1024/float64(max(r.Alive, 1)), r.Loaded.Threads)
	if r.MemIdle != nil && r.MemLoaded != nil {
		i, l := r.MemIdle, r.MemLoaded
		per := func(a, b uint64) string {
			return fmt.Sprintf("%.1f KiB", (float64(b)-float64(a))/1024/float64(max(r.Alive, 1)))
		}
		fmt.Fprintf(w, "    Go runtime per connected kite: %.2f goroutines, stacks %s, heap in use %s, Sys %s\n",
			float64(l.Goroutines-i.Goroutines)/float64(max(r.Alive, 1)), per(i.StackInuse, l.StackInuse),
			per(i.HeapInuse, l.HeapInuse), per(i.Sys, l.Sys))
		fmt.Fprintf(w, "    Go runtime totals: stacks %s, heap in use %s, heap idle %s (released %s), Sys %s, %d GC cycles\n",
			measure.MiB(int64(l.StackInuse)), measure.MiB(int64(l.HeapInuse)), measure.MiB(int64(l.HeapIdle)),
			measure.MiB(int64(l.HeapReleased)), measure.MiB(int64(l.Sys)), l.NumGC)
	}
	if r.Opts.Profile != "" {
		fmt.Fprintf(w, "    profiles in %s: cpu-register.pprof, heap.pprof, goroutines.txt\n", r.Opts.Profile)
	}
	fmt.Fprintf(w, "P2 %s (%s)\n", map[bool]string{true: "PASS", false: "MISSED a target"}[r.Pass()], r.Took.Round(time.Second))
}
