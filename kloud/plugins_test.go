package kloud_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// builtin is a minimal in-tree provider with an HTTP service.
func builtin(name string) *provider.Provider {
	return &provider.Provider{
		Name: name, ResourceType: name + "_machine",
		Stack:   func(*provider.BaseStack) (provider.Stack, error) { return nil, errors.New("none") },
		Machine: func(*provider.BaseMachine) (provider.Machine, error) { return nil, errors.New("none") },
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name+" "+r.URL.Path) }),
	}
}

// TestProviderList: provider.list shows in-tree providers as builtin, in process, with their
// capabilities, to any user.
func TestProviderList(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(builtin("intree"))
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg})
	res, err := e.Client("bob").ProviderList(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Providers) != 1 {
		t.Fatalf("provider.list: %+v", res)
	}
	p := res.Providers[0]
	if p.Name != "intree" || p.Kind != api.ProviderBuiltin || p.Where != "in process" || !p.Connected {
		t.Errorf("provider.list: %+v", p)
	}
	for _, c := range []string{"start", "stop", "info"} {
		if !slices.Contains(p.Capabilities, c) {
			t.Errorf("capabilities %v lack %s", p.Capabilities, c)
		}
	}
}

// TestProviderKeyCreate: only kloud administrators mint plugin keys, never for an in-tree
// provider's name; the key authenticates as that plugin, which may call plugin.register but no
// user method (-32002), and a user may not call plugin.register.
func TestProviderKeyCreate(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(builtin("intree"))
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg})
	ctx := t.Context()
	admin, bob := e.Client("admin"), e.Client("bob")

	if _, err := bob.ProviderKeyCreate(ctx, api.ProviderKeyCreateParams{Provider: "remote"}); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("keyCreate by a user: want -32002, got %v", err)
	}
	if _, err := admin.ProviderKeyCreate(ctx, api.ProviderKeyCreateParams{Provider: "intree"}); !errors.Is(err, kite.ErrConflict) {
		t.Errorf("keyCreate for an in-tree provider: want a conflict, got %v", err)
	}
	if _, err := admin.ProviderKeyCreate(ctx, api.ProviderKeyCreateParams{Provider: "Bad Name"}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Errorf("keyCreate for an invalid name: want invalid params, got %v", err)
	}
	res, err := admin.ProviderKeyCreate(ctx, api.ProviderKeyCreateParams{Provider: "remote"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Provider != "remote" || !strings.HasPrefix(res.KiteID, kitekey.PluginIDPrefix) || res.Key == "" {
		t.Errorf("keyCreate: %+v", res)
	}

	// The plugin key: no user method.
	pc := e.DialAuth(kite.Auth{Type: kitekey.KindPluginKey, Key: res.Key})
	for _, m := range []string{api.MethodStackList, api.MethodCredentialList, api.MethodProviderList, api.MethodProviderKeyCreate, api.MethodKontrolQuery} {
		var out any
		// Raw params on purpose: the same {} for every method, since the refusal comes before them.
		if err := pc.Call(ctx, m, map[string]any{}, &out); !errors.Is(err, kite.ErrPermission) {
			t.Errorf("%s with a plugin key: want -32002, got %v", m, err)
		}
	}
	// A user: no plugin.register.
	var out any
	// Raw params on purpose: a user's plugin.register, as a plugin's host would send it.
	err = e.Dial("bob").Call(ctx, api.MethodPluginRegister, map[string]any{"versions": []int{1}, "provider": map[string]any{"name": "remote"}}, &out)
	if !errors.Is(err, kite.ErrPermission) {
		t.Errorf("plugin.register by a user: want -32002, got %v", err)
	}
}

// TestProviderHTTPDispatch: /provider/NAME/ reaches provider NAME's handler, looked up per
// request: a provider registered after kloud started is served too.
func TestProviderHTTPDispatch(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(builtin("intree"))
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg})
	get := func(path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, e.URL+path, nil)
		resp, err := http.DefaultTransport.RoundTrip(req) // no redirects followed
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/provider/intree/v1/x"); code != 200 || body != "intree /provider/intree/v1/x" {
		t.Errorf("in-tree provider's service: %d %q", code, body)
	}
	if code, _ := get("/provider/later/v1/x"); code != http.StatusNotFound {
		t.Errorf("unknown provider: %d", code)
	}
	reg.Register(builtin("later"))
	if code, body := get("/provider/later/v1/x"); code != 200 || body != "later /provider/later/v1/x" {
		t.Errorf("provider registered after start: %d %q", code, body)
	}
	if code, _ := get("/provider/later"); code != http.StatusMovedPermanently {
		t.Errorf("/provider/later: %d, want a redirect to /provider/later/", code)
	}

	// A provider's service never sees a user's session cookie, and its answers cannot run as
	// kloud's UI.
	reg.Register(&provider.Provider{Name: "nosy", ResourceType: "nosy_machine",
		Stack:   func(*provider.BaseStack) (provider.Stack, error) { return nil, errors.New("none") },
		Machine: func(*provider.BaseMachine) (provider.Machine, error) { return nil, errors.New("none") },
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			io.WriteString(w, "cookie="+r.Header.Get("Cookie"))
		}),
	})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, e.URL+"/provider/nosy/v1/x", nil)
	req.Header.Set("Cookie", kloud.SessionCookie+"=secret-session")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "cookie=" {
		t.Errorf("the provider's service got the user's cookie: %q", b)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "sandbox") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q: want a script-less sandbox", csp)
	}
}

// testPluginDir returns a new plugin directory holding e2e/testplugin as
// kloud-provider-NAME.
func testPluginDir(t *testing.T, name string) string {
	t.Helper()
	bin := testutil.BuildBinary(t, "./e2e/testplugin")
	dir := t.TempDir()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, kloud.PluginPrefix+name), b, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	return dir
}

// TestPluginLaunchedInProcess: a kloud in this process (the test binary is the sandbox's
// launcher: TestMain calls tfsandbox.MaybeRun) launches the plugin of its plugin directory; it
// registers (Host.Wait), is listed connected, and after it is killed it is back.
func TestPluginLaunchedInProcess(t *testing.T) {
	t.Parallel()
	dir := testPluginDir(t, "inproc")
	e := kloudtest.Start(t, kloudtest.Options{PluginDir: dir, Plugins: kloud.PluginOptions{Insecure: os.Geteuid() != 0}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := e.Server.PluginHost().Wait(ctx, "inproc"); err != nil {
		t.Fatal(err)
	}
	list := func() api.ProviderStatus {
		res, err := e.Client("bob").ProviderList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Providers {
			if p.Name == "inproc" {
				return p
			}
		}
		t.Fatalf("inproc not listed: %+v", res)
		return api.ProviderStatus{}
	}
	st := list()
	if !st.Connected || st.Kind != api.ProviderPlugin || st.Version == "" || st.ConnectedAt == nil {
		t.Fatalf("provider.list: %+v", st)
	}
	if st.Where != "plugin" {
		t.Errorf("a user sees where the plugin runs: %q", st.Where)
	}
	adm, err := e.Client("admin").ProviderList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range adm.Providers {
		if p.Name == "inproc" && !strings.HasPrefix(p.Where, "launched (pid ") {
			t.Errorf("an admin sees where %q, want the launched pid", p.Where)
		}
	}
	first := *st.ConnectedAt
	syscall.Kill(e.Server.PluginPID("inproc"), syscall.SIGKILL) // the launcher: the sandbox dies with it
	testutil.Eventually(t, 30*time.Second, func() bool {
		st = list()
		return st.Connected && st.ConnectedAt.After(first)
	}, "plugin not back after it was killed: %+v", st)
}

// TestPluginUntrustedNotLaunched: a plugin binary others may write is not launched.
func TestPluginUntrustedNotLaunched(t *testing.T) {
	t.Parallel()
	bin := testutil.BuildBinary(t, "./e2e/testplugin")
	dir := t.TempDir()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, kloud.PluginPrefix+"loose")
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o777)
	os.Chmod(dir, 0o755)
	var log syncBuf
	e := kloudtest.Start(t, kloudtest.Options{PluginDir: dir, Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Plugins: kloud.PluginOptions{Insecure: os.Geteuid() != 0}})
	testutil.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(log.String(), "writable by group or others")
	}, "kloud did not refuse a world-writable plugin binary:\n%s", &log)
	if pid := e.Server.PluginPID("loose"); pid != 0 {
		t.Errorf("the plugin runs (pid %d)", pid)
	}
}

// TestPluginUnderCgroupLimits: with PluginOptions.Limits a sandboxed plugin runs in a cgroup
// kloud/kp-... with those limits; killed, its cgroup is removed, and it comes back in a new one.
func TestPluginUnderCgroupLimits(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	hs, err := cgroups.Hierarchies()
	if err != nil || hs["pids"].Mount == "" || hs["memory"].Mount == "" {
		testutil.Unavailable(t, "no pids or memory cgroup controller: %v", err)
	}
	dir := testPluginDir(t, "limited")
	lim := &cgroups.Limits{PidsMax: 64, MemoryBytes: 256 << 20, CPUs: 0.5}
	e := kloudtest.Start(t, kloudtest.Options{PluginDir: dir, Plugins: kloud.PluginOptions{Limits: lim}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := e.Server.PluginHost().Wait(ctx, "limited"); err != nil {
		t.Fatal(err)
	}
	group := func(pid int) string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.SplitN(l, ":", 3); len(f) == 3 && strings.Contains(","+f[1]+",", ",pids,") {
				return f[2]
			}
		}
		return ""
	}
	pid := e.Server.PluginPID("limited")
	rel := group(pid)
	if !strings.HasPrefix(rel, "/kloud/kp-plugin-limited-") {
		t.Fatalf("plugin launcher %d is in pids cgroup %q, want /kloud/kp-plugin-limited-*", pid, rel)
	}
	pidsDir, memDir := filepath.Join(hs["pids"].Mount, rel), filepath.Join(hs["memory"].Mount, rel)
	read := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }
	if got := read(filepath.Join(pidsDir, "pids.max")); got != "64" {
		t.Errorf("pids.max = %q, want 64", got)
	}
	memFile := "memory.limit_in_bytes"
	if hs["memory"].V2 {
		memFile = "memory.max"
	}
	if got := read(filepath.Join(memDir, memFile)); got != fmt.Sprint(256<<20) {
		t.Errorf("%s = %q, want %d", memFile, got, 256<<20)
	}
	if procs := strings.Fields(read(filepath.Join(pidsDir, "cgroup.procs"))); len(procs) < 3 {
		t.Errorf("cgroup.procs = %v: want the launcher, init and the plugin", procs)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := os.Stat(pidsDir)
		return errors.Is(err, os.ErrNotExist)
	}, "cgroup %s left after the plugin was killed", pidsDir)
	testutil.Eventually(t, 30*time.Second, func() bool {
		p := e.Server.PluginPID("limited")
		return p != 0 && p != pid && strings.HasPrefix(group(p), "/kloud/kp-plugin-limited-")
	}, "plugin not back in a cgroup of its own")
}

// TestPluginForkBombStaysInCgroup: a plugin that forks without end (the test plugin named
// forkbomb) fills its own cgroup's pids limit and no more, while kloud answers calls and this
// process forks; when kloud stops, the plugin's cgroup is gone and none of its processes is left.
func TestPluginForkBombStaysInCgroup(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	hs, err := cgroups.Hierarchies()
	if err != nil || hs["pids"].Mount == "" {
		testutil.Unavailable(t, "no pids cgroup controller: %v", err)
	}
	dir := testPluginDir(t, "forkbomb")
	const pidsMax = 48
	lim := &cgroups.Limits{PidsMax: pidsMax, MemoryBytes: 256 << 20, CPUs: 0.25}
	e := kloudtest.Start(t, kloudtest.Options{PluginDir: dir, Plugins: kloud.PluginOptions{Limits: lim}})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := e.Server.PluginHost().Wait(ctx, "forkbomb"); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }
	// pidsDir is the pids cgroup of the plugin's launcher now ("" between launches).
	pidsDir := func() string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", e.Server.PluginPID("forkbomb")))
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.SplitN(l, ":", 3); len(f) == 3 && strings.Contains(","+f[1]+",", ",pids,") &&
				strings.HasPrefix(f[2], "/kloud/kp-plugin-forkbomb-") {
				return filepath.Join(hs["pids"].Mount, f[2])
			}
		}
		return ""
	}
	// refused is how many forks the group's pids limit refused.
	refused := func(d string) int {
		n := 0
		fmt.Sscanf(read(filepath.Join(d, "pids.events")), "max %d", &n)
		return n
	}
	var cg string
	seen := map[string]bool{} // every process seen in the plugin's cgroup
	testutil.Eventually(t, time.Minute, func() bool {
		cg = pidsDir()
		for _, p := range strings.Fields(read(filepath.Join(cg, "cgroup.procs"))) {
			seen[p] = true
		}
		return cg != "" && read(filepath.Join(cg, "pids.current")) == fmt.Sprint(pidsMax) && refused(cg) > 0
	}, "the fork bomb never reached its cgroup's pids limit %d", pidsMax)
	if got := read(filepath.Join(cg, "pids.max")); got != fmt.Sprint(pidsMax) {
		t.Fatalf("pids.max = %q, want %d", got, pidsMax)
	}
	before := refused(cg)
	c := e.Client("alice")
	for i := range 20 {
		if _, err := c.Version(ctx); err != nil {
			t.Fatalf("version call %d during the fork bomb: %v", i, err)
		}
		if err := exec.CommandContext(ctx, "true").Run(); err != nil {
			t.Fatalf("this process cannot fork during the fork bomb: %v", err)
		}
		for _, p := range strings.Fields(read(filepath.Join(cg, "cgroup.procs"))) {
			seen[p] = true
		}
		if n, _ := strconv.Atoi(read(filepath.Join(cg, "pids.current"))); n > pidsMax {
			t.Errorf("pids.current %d over pids.max %d", n, pidsMax)
		}
	}
	// The bomb went on while kloud answered: the group kept refusing forks. The plugin's own Go
	// runtime may die of it (no thread can start at pids.max): kloud then restarts it in a new
	// group, where the bomb goes on.
	testutil.Eventually(t, 30*time.Second, func() bool {
		if d := pidsDir(); d != "" && d != cg {
			t.Logf("the plugin was restarted (its bomb killed it) in %s", d)
			cg, before = d, 0
		}
		for _, p := range strings.Fields(read(filepath.Join(cg, "cgroup.procs"))) {
			seen[p] = true
		}
		return refused(cg) > before
	}, "no fork refused after the calls: the bomb stopped")
	t.Logf("%s: pids.current %s, forks refused %d, %d processes seen", cg, read(filepath.Join(cg, "pids.current")),
		refused(cg), len(seen))

	e.Stop()
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := os.Stat(cg)
		return errors.Is(err, os.ErrNotExist)
	}, "cgroup %s left after kloud stopped", cg)
	testutil.Eventually(t, 30*time.Second, func() bool {
		for p := range seen {
			if _, err := os.Stat("/proc/" + p); err == nil {
				return false
			}
		}
		return true
	}, "processes of the fork bomb left after kloud stopped")
	for _, rel := range cgroups.Orphans(tfsandbox.CgroupPrefixPlugin + "plugin-forkbomb-") {
		t.Errorf("cgroup %s left", rel)
	}
}
