// Command plugin measures the cost of the plugin boundary (provider/plugin): the example
// provider (examples/provider-example) compiled into kloud against the same provider as a
// plugin process that kloud launched from its plugin directory, in the same run:
//
//  1. machine.info of a Running machine (the typed client's call, over kite on loopback, to its
//     result): kloud's own work plus one provider Info, in-process a Go call, as a plugin a kite
//     call to the plugin process and back. -info calls per side, the two sides interleaved in
//     blocks of 10.
//  2. stack.apply of a 2-machine stack, from the call until job.watch says it succeeded (terraform
//     ran, both machines booted through the provider's HTTP service, both agents connected).
//     -builds builds per side, interleaved; each on a new stack, destroyed after (not timed).
//     The in-process provider is wrapped to count the provider calls a build makes (each is a
//     kite call as a plugin): the target allows 2 ms per call.
//  3. Plugin restart after a crash: SIGKILL of the plugin process, until kloud's launcher has
//     started it again, it has registered and a machine.info through it succeeds (the machine
//     then reports Stopped: its processes died with the plugin). -crashes times, a minute apart
//     would reset the launcher's backoff; they are 0 s apart here, so the second and later
//     include the backoff's doubling (0.2 s, 0.4 s, ...) and the first is the figure.
//
// Targets: plugin ≤ 1.1 × in-process + 2 ms per provider call (machine.info: 1 call; stack.apply:
// the counted calls); restart < 2 s. It exits 1 if one is missed, 2 on an error.
//
// Both kloud servers run in this process (kloud.New, as `kloud serve` does, each with its own
// data dir, store and an in-process terraformer running real terraform sandboxed), with real
// klient processes as agents; the plugin runs sandboxed as uid 65534 as `kloud serve` would run
// it. Needs root (the terraform and plugin sandboxes), terraform and its offline mirror
// ($KLOUD_CACHE/env), curl.
//
//	set -a && . /var/cache/kloud/env && set +a && go run ./bench/plugin [-info 200] [-builds 5] [-crashes 3]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/examples/provider-example/example"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

func main() {
	tfsandbox.MaybeRun() // terraform's and the plugin's sandbox launcher re-execute this binary
	infoN := flag.Int("info", 200, "machine.info calls per side")
	builds := flag.Int("builds", 5, "stack.apply builds per side")
	crashes := flag.Int("crashes", 3, "plugin crashes to time")
	keep := flag.Bool("keep", false, "keep the temp dir (kloud logs)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	missed, err := run(ctx, *infoN, *builds, *crashes, *keep)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plugin:", err)
		os.Exit(2)
	}
	if missed {
		os.Exit(1)
	}
}

func run(ctx context.Context, infoN, builds, crashes int, keep bool) (missed bool, err error) {
	if os.Geteuid() != 0 {
		return false, errors.New("needs root (terraform's and the plugin's sandboxes)")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		return false, err
	}
	tmp, err := os.MkdirTemp("", "kloud-bench-plugin-")
	if err != nil {
		return false, err
	}
	if keep {
		fmt.Println("temp dir:", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	// The plugin (uid 65534) reads its binary's directory.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return false, err
	}
	pluginDir := filepath.Join(tmp, "plugins")
	klientBin := filepath.Join(tmp, "klient")
	for _, b := range [][2]string{{"./cmd/klient", klientBin}, {"./examples/provider-example", filepath.Join(pluginDir, "kloud-provider-example")}} {
		out, err := exec.CommandContext(ctx, "go", "build", "-o", b[1], b[0]).CombinedOutput()
		if err != nil {
			return false, fmt.Errorf("go build %s: %w\n%s", b[0], err, out)
		}
	}
	if err := os.Chmod(pluginDir, 0o755); err != nil {
		return false, err
	}

	counted := &counter{}
	inReg := provider.NewRegistry()
	inReg.Register(counted.wrap(example.New(example.Options{Dir: filepath.Join(tmp, "inproc-state")})))
	in, err := startKloud(ctx, filepath.Join(tmp, "inproc"), kloud.Options{Providers: inReg, KlientBin: klientBin, Plugins: kloud.PluginOptions{NoLaunch: true}})
	if err != nil {
		return false, err
	}
	defer in.close()
	pl, err := startKloud(ctx, filepath.Join(tmp, "plugin"), kloud.Options{KlientBin: klientBin, PluginDir: pluginDir})
	if err != nil {
		return false, err
	}
	defer pl.close()
	if err := pl.waitProvider(ctx, 30*time.Second); err != nil {
		return false, fmt.Errorf("the plugin never registered: %w (its log: %s)", err, filepath.Join(tmp, "plugin", "kloud.log"))
	}
	for _, k := range []*kloudEnv{in, pl} {
		if err := k.prepare(ctx); err != nil {
			return false, fmt.Errorf("%s: %w", k.name, err)
		}
	}

	// Warm-up build on both (terraform init, klient download cache): not counted.
	var inStack, plStack string
	for _, k := range []*kloudEnv{in, pl} {
		sid, _, err := k.build(ctx)
		if err != nil {
			return false, fmt.Errorf("%s: warm-up build: %w", k.name, err)
		}
		if k == in {
			inStack = sid
		} else {
			plStack = sid
		}
	}

	// 1. machine.info, interleaved in blocks of 10.
	inM, err := in.firstMachine(ctx, inStack)
	if err != nil {
		return false, err
	}
	plM, err := pl.firstMachine(ctx, plStack)
	if err != nil {
		return false, err
	}
	counted.reset()
	var inInfo, plInfo []time.Duration
	for len(inInfo) < infoN {
		for _, side := range []struct {
			k   *kloudEnv
			m   string
			out *[]time.Duration
		}{{in, inM, &inInfo}, {pl, plM, &plInfo}} {
			for range 10 {
				start := time.Now()
				info, err := side.k.c.MachineInfo(ctx, api.MachineRef{MachineID: side.m})
				if err != nil || info.InfoError != "" || info.InfraState != provider.Running {
					return false, fmt.Errorf("%s: machine.info: %+v %v", side.k.name, info, err)
				}
				*side.out = append(*side.out, time.Since(start))
			}
		}
	}
	infoCalls := float64(counted.n.Load()) / float64(len(inInfo))
	for _, k := range []struct {
		k   *kloudEnv
		sid string
	}{{in, inStack}, {pl, plStack}} {
		if err := k.k.destroy(ctx, k.sid); err != nil {
			return false, err
		}
	}

	// 2. stack.apply, interleaved.
	var inApply, plApply []time.Duration
	var buildCalls []int64
	for range builds {
		for _, k := range []*kloudEnv{in, pl} {
			counted.reset()
			sid, d, err := k.build(ctx)
			if err != nil {
				return false, fmt.Errorf("%s: build: %w", k.name, err)
			}
			if k == in {
				inApply = append(inApply, d)
				buildCalls = append(buildCalls, counted.n.Load())
			} else {
				plApply = append(plApply, d)
			}
			if err := k.destroy(ctx, sid); err != nil {
				return false, err
			}
		}
	}

	// 3. Crash and restart.
	sid, _, err := pl.build(ctx)
	if err != nil {
		return false, err
	}
	m, err := pl.firstMachine(ctx, sid)
	if err != nil {
		return false, err
	}
	var restarts []time.Duration
	for range crashes {
		d, err := pl.crash(ctx, m)
		if err != nil {
			return false, err
		}
		restarts = append(restarts, d)
	}

	// Report.
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("example provider, in-process vs plugin (launched, sandboxed, uid 65534); %s/%s, %d CPUs, load %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "))
	li, lp := measure.Summarize(inInfo), measure.Summarize(plInfo)
	fmt.Printf("\nmachine.info (%d calls each, %.0f provider call each)\n", li.N, infoCalls)
	fmt.Printf("  in-process  p50 %s  p90 %s  p99 %s\n", ms(li.P50), ms(li.P90), ms(li.P99))
	fmt.Printf("  plugin      p50 %s  p90 %s  p99 %s\n", ms(lp.P50), ms(lp.P90), ms(lp.P99))
	missed = verdict("machine.info p50", li.P50, lp.P50, int64(infoCalls)) || missed
	ai, ap := measure.Summarize(inApply), measure.Summarize(plApply)
	calls := slices.Max(buildCalls)
	fmt.Printf("\nstack.apply, 2 machines, to succeeded with both agents connected (%d builds each, %d provider calls per build)\n", ai.N, calls)
	fmt.Printf("  in-process  median %s  min %s  max %s\n", ms(ai.P50), ms(slices.Min(inApply)), ms(ai.Max))
	fmt.Printf("  plugin      median %s  min %s  max %s\n", ms(ap.P50), ms(slices.Min(plApply)), ms(ap.Max))
	missed = verdict("stack.apply median", ai.P50, ap.P50, calls) || missed
	fmt.Printf("\nplugin restart after SIGKILL, to a machine.info served by the new process (launcher backoff 0.2 s doubling):\n ")
	for i, d := range restarts {
		fmt.Printf(" #%d %s", i+1, ms(d))
	}
	fmt.Println()
	if len(restarts) > 0 {
		fmt.Printf("  target < 2 s (first crash): ")
		if restarts[0] >= 2*time.Second {
			fmt.Println("MISSED")
			missed = true
		} else {
			fmt.Println("met")
		}
	}
	return missed, nil
}

func verdict(what string, in, pl time.Duration, calls int64) bool {
	limit := time.Duration(1.1*float64(in)) + time.Duration(calls)*2*time.Millisecond
	fmt.Printf("  %s: plugin %s vs in-process %s = %.2f×, %+.1f ms; target ≤ 1.1× + %d × 2 ms = %s: ",
		what, ms(pl), ms(in), float64(pl)/float64(in), float64(pl-in)/float64(time.Millisecond), calls, ms(limit))
	if pl > limit {
		fmt.Println("MISSED")
		return true
	}
	fmt.Println("met")
	return false
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// counter wraps a provider to count the calls kloud makes into it (each would be a kite call to
// a plugin).
type counter struct{ n atomic.Int64 }

func (c *counter) reset() { c.n.Store(0) }

func (c *counter) wrap(p *provider.Provider) *provider.Provider {
	w := *p
	w.Stack = func(b *provider.BaseStack) (provider.Stack, error) {
		s, err := p.Stack(b)
		return countedStack{s, c}, err
	}
	w.Machine = func(b *provider.BaseMachine) (provider.Machine, error) {
		m, err := p.Machine(b)
		return countedMachine{m, c}, err
	}
	if p.Available != nil {
		w.Available = func() error { c.n.Add(1); return p.Available() }
	}
	w.Handler = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		c.n.Add(1)
		p.Handler.ServeHTTP(rw, r)
	})
	return &w
}

type countedStack struct {
	s provider.Stack
	c *counter
}

func (s countedStack) VerifyCredential(ctx context.Context, cr *provider.Credential) error {
	s.c.n.Add(1)
	return s.s.VerifyCredential(ctx, cr)
}

func (s countedStack) BootstrapTemplates(ctx context.Context, cr *provider.Credential) ([]*provider.Template, error) {
	s.c.n.Add(1)
	return s.s.BootstrapTemplates(ctx, cr)
}

func (s countedStack) ApplyTemplate(ctx context.Context, cr *provider.Credential) (*provider.Template, error) {
	s.c.n.Add(1)
	return s.s.ApplyTemplate(ctx, cr)
}

type countedMachine struct {
	m provider.Machine
	c *counter
}

func (m countedMachine) Start(ctx context.Context) (any, error) { m.c.n.Add(1); return m.m.Start(ctx) }
func (m countedMachine) Stop(ctx context.Context) (any, error)  { m.c.n.Add(1); return m.m.Stop(ctx) }
func (m countedMachine) Info(ctx context.Context) (provider.State, any, error) {
	m.c.n.Add(1)
	return m.m.Info(ctx)
}

// kloudEnv is one kloud server in this process, with its terraformer, and an admin client.
type kloudEnv struct {
	name   string
	s      *kloud.Server
	url    string
	c      *api.Client
	cancel context.CancelFunc
	done   chan struct{}
	closes []func()
	tmplID string
}

func startKloud(ctx context.Context, dir string, o kloud.Options) (*kloudEnv, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "kloud.log"))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	k := &kloudEnv{name: filepath.Base(dir), url: "http://" + ln.Addr().String(), done: make(chan struct{})}
	k.closes = append(k.closes, func() { logf.Close() })
	o.DataDir, o.Addr, o.PublicURL = filepath.Join(dir, "data"), ln.Addr().String(), k.url
	o.Logger = slog.New(slog.NewTextHandler(logf, nil))
	if k.s, err = kloud.New(ctx, o); err != nil {
		ln.Close()
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go func() {
		defer close(k.done)
		k.s.ServeListener(sctx, ln)
	}()
	if err := k.startTerraformer(ctx, filepath.Join(dir, "terraformer"), o.Logger); err != nil {
		k.close()
		return nil, err
	}
	// A member of the default team (the admin is in no team).
	key, _, err := k.s.Kontrol.CreateKey(kloud.Admin, "")
	if err == nil {
		var admin *api.Client
		if admin, err = k.dial(ctx, key); err == nil {
			_, err = admin.UserAdd(ctx, api.UserAddParams{Username: "bench", Team: model.DefaultTeam})
		}
	}
	if err == nil {
		key, _, err = k.s.Kontrol.CreateKey("bench", "")
	}
	if err == nil {
		k.c, err = k.dial(ctx, key)
	}
	if err != nil {
		k.close()
		return nil, err
	}
	return k, nil
}

func (k *kloudEnv) dial(ctx context.Context, key string) (*api.Client, error) {
	kk, err := kite.New(kite.Options{Identity: kite.Identity{Name: "bench"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	k.closes = append(k.closes, func() { kk.Close() })
	conn, err := kk.Dial(ctx, k.url+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: key})
	if err != nil {
		return nil, err
	}
	return api.NewClient(conn), nil
}

// startTerraformer runs a terraformer in this process that trusts this kloud's keys and
// connects kloud to it (what kloudtest.StartTerraformer does for tests).
func (k *kloudEnv) startTerraformer(ctx context.Context, dir string, log *slog.Logger) error {
	engine, err := tfrun.New(ctx, tfrun.Options{Dir: dir, Logger: log})
	if err != nil {
		return err
	}
	tk, err := kite.New(kite.Options{
		Identity:      kite.Identity{Name: terraformer.Name},
		Authenticator: terraformer.NewAuthenticator(terraformer.AuthOptions{KloudURL: k.url}),
		Logger:        log,
	})
	if err != nil {
		return err
	}
	if _, err := terraformer.New(terraformer.Options{Engine: engine, Kite: tk, Logger: log}); err != nil {
		return err
	}
	srv := httptest.NewServer(terraformer.Handler(tk, engine))
	key, err := kitekey.ReadFile(k.s.KloudKeyPath())
	if err != nil {
		return err
	}
	ck, err := kite.New(kite.Options{Identity: kite.Identity{Name: "kloud", Username: "kloud"}, Logger: log})
	if err != nil {
		return err
	}
	c := terraformer.NewClient(ck, srv.URL+"/kite", func(context.Context) (kite.Auth, error) {
		return kite.Auth{Type: kite.AuthKiteKey, Key: key}, nil
	})
	k.closes = append(k.closes, func() { c.Close(); ck.Close(); tk.Close(); srv.Close() })
	k.s.SetTerraformer(c)
	return nil
}

func (k *kloudEnv) close() {
	k.cancel()
	<-k.done
	k.s.WaitJobs()
	for i := len(k.closes) - 1; i >= 0; i-- {
		k.closes[i]()
	}
}

// waitProvider waits until kloud offers the example provider (a plugin: once it registered).
func (k *kloudEnv) waitProvider(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		res, err := k.c.ProviderDescribe(ctx, api.ProviderDescribeParams{})
		if err == nil {
			for _, d := range res.Providers {
				if d.Name == "example" && d.Available {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("provider example not offered after %s (last error: %v)", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

const template = `
resource "terraform_data" "vm" {
  count = 2
  input = "#!/bin/bash\necho up"
}
`

// prepare adds a credential (verified) and the template.
func (k *kloudEnv) prepare(ctx context.Context) error {
	cr, err := k.c.CredentialAdd(ctx, api.CredentialAddParams{Provider: "example", Title: "bench", Data: json.RawMessage(`{"label":"bench","maxMachines":2}`)})
	if err != nil {
		return err
	}
	if res, err := k.c.CredentialAuthenticate(ctx, api.CredentialRef{CredentialID: cr.ID}); err != nil || !res.Verified {
		return fmt.Errorf("authenticate: %+v %v", res, err)
	}
	t, err := k.c.TemplateCreate(ctx, api.TemplateParams{Title: "bench", Files: map[string]string{"main.tf": template}})
	if err != nil {
		return err
	}
	k.tmplID = t.ID
	return nil
}

// build creates a stack and times its stack.apply until the job succeeded.
func (k *kloudEnv) build(ctx context.Context) (string, time.Duration, error) {
	st, err := k.c.StackCreate(ctx, api.StackPlanParams{TemplateID: k.tmplID})
	if err != nil {
		return "", 0, err
	}
	start := time.Now()
	ref, err := k.c.StackApply(ctx, api.StackApplyParams{StackID: st.Stack.ID})
	if err != nil {
		return "", 0, err
	}
	if err := k.wait(ctx, ref.JobID); err != nil {
		return "", 0, err
	}
	return st.Stack.ID, time.Since(start), nil
}

func (k *kloudEnv) destroy(ctx context.Context, sid string) error {
	ref, err := k.c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
	if err != nil {
		return err
	}
	return k.wait(ctx, ref.JobID)
}

func (k *kloudEnv) wait(ctx context.Context, jobID string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	w, err := k.c.JobWatch(ctx, api.JobRef{JobID: jobID})
	if err != nil {
		return err
	}
	defer w.Close()
	var last api.JobEvent
	for {
		ev, err := w.Next(ctx)
		if errors.Is(err, kite.ErrStreamEnded) {
			break
		}
		if err != nil {
			return err
		}
		last = ev
	}
	if last.Status != "succeeded" {
		return fmt.Errorf("job %s: %s: %s", jobID, last.Status, last.Error)
	}
	return nil
}

func (k *kloudEnv) firstMachine(ctx context.Context, sid string) (string, error) {
	res, err := k.c.MachineList(ctx, api.MachineListParams{StackID: sid})
	if err != nil || len(res.Machines) == 0 {
		return "", fmt.Errorf("machines of %s: %v", sid, err)
	}
	return res.Machines[0].ID, nil
}

// crash kills the plugin process (SIGKILL) and times until a machine.info is served again by
// the process kloud's launcher started in its place.
func (k *kloudEnv) crash(ctx context.Context, machineID string) (time.Duration, error) {
	launcher := k.s.PluginPID("example")
	pid, err := pluginPID(launcher)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, err
	}
	// A new launcher runs only once the old one has exited (the supervisor restarts it then);
	// from there, the first machine.info that succeeds was served by the new plugin.
	restarted := false
	for time.Since(start) < time.Minute {
		if !restarted {
			p := k.s.PluginPID("example")
			restarted = p != 0 && p != launcher
		}
		if restarted {
			info, err := k.c.MachineInfo(ctx, api.MachineRef{MachineID: machineID})
			if err == nil && info.InfoError == "" {
				return time.Since(start), nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, errors.New("the plugin did not come back within a minute")
}

// pluginPID finds the plugin process under its sandbox's launcher: the descendant of launcher
// whose command is the plugin binary (the kernel keeps 15 bytes of its name).
func pluginPID(launcher int) (int, error) {
	if launcher == 0 {
		return 0, errors.New("no plugin runs")
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "kloud-provider-" {
			continue
		}
		for p := pid; p > 1; p = parent(p) {
			if p == launcher {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("no plugin process under launcher %d", launcher)
}

// parent returns pid's parent pid (0 if it is gone).
func parent(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // state ppid ...
	if len(f) < 2 {
		return 0
	}
	pp, _ := strconv.Atoi(f[1])
	return pp
}
