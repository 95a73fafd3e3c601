package e2e

// Provider plugins (issue 11): kloud launches the plugins of its plugin directory sandboxed,
// restarts them when they die, refuses a plugin API version it does not speak, accepts remote
// plugins with a plugin key (which can call no user method), fails a build whose plugin dies
// mid-build with a reason naming it, and leaves no plugin process behind when it stops. The plugin
// is e2e/testplugin, a real plugin binary (provider/plugin.Serve), installed with
// `kloud provider install`.

import (
	"encoding/json"
	"errors"
	"io"
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

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
)

// newPluginEnv is newEnv without the dummy provider: the test plugin's machines are
// terraform_data resources, like the dummy's.
func newPluginEnv(t *testing.T, extra ...string) *env {
	t.Helper()
	testutil.RequireRoot(t) // the plugin sandbox (and the launcher's uid change) need root
	testutil.RequireBinary(t, "terraform")
	e := &env{t: t, dir: t.TempDir(), addr: testutil.FreeLoopback(t), extra: extra, noDummy: true}
	e.start()
	t.Cleanup(e.cleanup)
	return e
}

func testPluginBin(t *testing.T) string { return testutil.BuildBinary(t, "./e2e/testplugin") }

// providers returns `kloud provider list` by name.
func (e *env) providers() map[string]api.ProviderStatus {
	e.t.Helper()
	var ps []api.ProviderStatus
	e.runJSON(&ps, "provider", "list")
	out := map[string]api.ProviderStatus{}
	for _, p := range ps {
		out[p.Name] = p
	}
	return out
}

// waitProvider waits until provider name's status satisfies ok and returns it.
func (e *env) waitProvider(name string, timeout time.Duration, ok func(api.ProviderStatus) bool, what string) api.ProviderStatus {
	e.t.Helper()
	var st api.ProviderStatus
	testutil.Eventually(e.t, timeout, func() bool {
		var found bool
		st, found = e.providers()[name]
		return found && ok(st)
	}, "provider %s: %s; last status %+v\nkloud log:\n%s", name, what, st, e.kloudOut)
	return st
}

// pluginProcs returns the processes of plugin name under kloud: its launcher, the sandbox's init
// and the plugin.
func (e *env) pluginProcs(name string) (plugin osProc, all []osProc) {
	bin := filepath.Join(e.dir, "plugins", "kloud-provider-"+name)
	var launcher int
	for _, p := range tree(e.kloud.Process.Pid) {
		if p.ppid == e.kloud.Process.Pid && strings.HasPrefix(p.cmdline, "kloud-provider-"+name+" (launcher)") {
			launcher = p.pid
		}
	}
	if launcher == 0 {
		return osProc{}, nil
	}
	all = tree(launcher)
	for _, p := range all {
		if p.cmdline == bin || strings.HasPrefix(p.cmdline, bin+" ") {
			plugin = p
		}
	}
	return plugin, all
}

func (e *env) waitPluginProc(name string) (osProc, []osProc) {
	e.t.Helper()
	var p osProc
	var all []osProc
	testutil.Eventually(e.t, 30*time.Second, func() bool {
		p, all = e.pluginProcs(name)
		return p.pid != 0
	}, "no process of plugin %s under kloud", name)
	return p, all
}

// testplugin's probe line (e2e/testplugin).
type pluginProbe struct {
	UID, GID, PID  int
	StateDir       string
	DataDir        string
	DataDirEntries []string
	ReadKey        string
	Env            []string
}

// logProbe returns the first probe line plugin name printed, from kloud's log (a slog text
// line: msg="plugin: testplugin probe {...}" provider=name).
func (e *env) logProbe(name string) (pluginProbe, bool) {
	for _, line := range strings.Split(e.kloudOut.String(), "\n") {
		i := strings.Index(line, `msg="plugin: testplugin probe `)
		if i < 0 || !strings.Contains(line, "provider="+name) {
			continue
		}
		q, err := strconv.QuotedPrefix(line[i+len("msg="):])
		if err != nil {
			continue
		}
		msg, _ := strconv.Unquote(q)
		var p pluginProbe
		if json.Unmarshal([]byte(strings.TrimPrefix(msg, "plugin: testplugin probe ")), &p) == nil {
			return p, true
		}
	}
	return pluginProbe{}, false
}

// TestPluginLaunchedSandboxedRestarted: `kloud provider install` puts the plugin in the plugin
// directory; the running kloud starts it, sandboxed (uid 65534, own pid namespace, none of
// kloud's files, nothing of kloud's environment), it registers and is listed connected with its
// version and capabilities, its HTTP service is served under /provider/NAME/; killed, it is back
// and serving within seconds (a request to it made while it is down waits for it); when kloud
// stops, no process of it is left.
func TestPluginLaunchedSandboxedRestarted(t *testing.T) {
	parallel(t)
	e := newPluginEnv(t)
	out := e.run("provider", "install", testPluginBin(t), "--name", "testplug", "--wait", "60s")
	t.Logf("provider install:\n%s", out)
	if !strings.Contains(out, "provider testplug: connected") {
		t.Fatalf("install did not report the plugin connected:\n%s", out)
	}
	st := e.providers()["testplug"]
	if st.Kind != api.ProviderPlugin || !st.Connected || st.Version == "" || !strings.Contains(st.Where, "launched") ||
		st.ConnectedAt == nil || st.APIVersion == 0 {
		t.Errorf("provider list: %+v", st)
	}
	for _, c := range []string{"start", "stop", "info"} {
		if !slices.Contains(st.Capabilities, c) {
			t.Errorf("capabilities %v lack %s", st.Capabilities, c)
		}
	}
	table := e.run("provider", "list")
	t.Logf("provider list:\n%s", table)
	if !strings.Contains(table, "testplug") || !strings.Contains(table, "plugin") {
		t.Errorf("provider list table:\n%s", table)
	}

	// The sandbox, as the plugin sees it (its probe line in kloud's log) and as the host does.
	probe, ok := e.logProbe("testplug")
	if !ok {
		t.Fatalf("no probe line of testplug in kloud's log:\n%s", e.kloudOut)
	}
	t.Logf("probe: %+v", probe)
	if probe.UID != 65534 || probe.GID != 65534 {
		t.Errorf("plugin runs as uid %d gid %d, want 65534", probe.UID, probe.GID)
	}
	for _, ent := range probe.DataDirEntries {
		if ent != "plugins" && ent != "plugin-state" {
			t.Errorf("plugin sees %s in kloud's data dir %s (sees %v)", ent, probe.DataDir, probe.DataDirEntries)
		}
	}
	if probe.ReadKey == "" {
		t.Errorf("plugin could read kloud's admin key")
	}
	for _, v := range probe.Env {
		if !slices.Contains([]string{"PATH", "HOME", "TMPDIR", "KLOUD_PLUGIN_URL", "KLOUD_PLUGIN_KEY", "KLOUD_PLUGIN_STATE_DIR"}, v) {
			t.Errorf("plugin's environment has %s (all: %v)", v, probe.Env)
		}
	}
	proc, _ := e.waitPluginProc("testplug")
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(proc.pid) + "/status")
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "NSpid:") && len(strings.Fields(line)) != 3 {
			t.Errorf("plugin %d is not in a pid namespace of its own: %s", proc.pid, line)
		}
		if strings.HasPrefix(line, "CapEff:") && strings.TrimSpace(strings.TrimPrefix(line, "CapEff:")) != "0000000000000000" {
			t.Errorf("plugin has capabilities: %s", line)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dir, "plugin-state", "testplug")); err != nil {
		t.Errorf("no state dir: %v", err)
	}

	// Its HTTP service, through kloud's /provider/ dispatcher (it registered after kloud started).
	resp, err := http.Get(e.url() + "/provider/testplug/probe")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var hp pluginProbe
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &hp) != nil || hp.UID != 65534 {
		t.Errorf("GET /provider/testplug/probe: %s\n%s", resp.Status, body)
	}

	// Crash: SIGKILL the plugin; kloud logs the exit and starts it again. A request made while
	// it is down waits for the restarted plugin (issue 23: it got 503 "not connected").
	disconnects := strings.Count(e.kloudOut.String(), `msg="provider plugin disconnected"`)
	killed := time.Now()
	syscall.Kill(proc.pid, syscall.SIGKILL)
	testutil.Eventually(t, 10*time.Second, func() bool {
		return strings.Count(e.kloudOut.String(), `msg="provider plugin disconnected"`) > disconnects
	}, "kloud did not see the killed plugin disconnect:\n%s", e.kloudOut)
	asked := time.Now()
	resp, err = http.Get(e.url() + "/provider/testplug/probe")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /provider/testplug/probe while the plugin restarts: %s\n%s", resp.Status, body)
	}
	t.Logf("a request made %s after the SIGKILL, while the plugin was down, answered %s in %s", asked.Sub(killed).Round(time.Millisecond), resp.Status, time.Since(asked).Round(time.Millisecond))
	// How fast it comes back is a figure, not an assertion (a loaded CI host took 15s, most of
	// it the sandboxed start); the wait only bounds a restart that never happens.
	st = e.waitProvider("testplug", 60*time.Second, func(s api.ProviderStatus) bool {
		return s.Connected && s.ConnectedAt != nil && s.ConnectedAt.After(killed)
	}, "not connected again after SIGKILL")
	t.Logf("plugin back and serving %s after SIGKILL (target < 2s): %+v", time.Since(killed).Round(time.Millisecond), st)
	if !strings.Contains(e.kloudOut.String(), "exited (killed by SIGKILL)") {
		t.Errorf("kloud's log does not say how the plugin ended:\n%s", e.kloudOut)
	}
	if p2, _ := e.waitPluginProc("testplug"); p2.pid == proc.pid {
		t.Errorf("the plugin's pid did not change after the restart")
	}
	resp, err = http.Get(e.url() + "/provider/testplug/probe")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET /provider/testplug/probe after the restart: %v %v", err, resp)
	}
	if resp != nil {
		resp.Body.Close()
	}

	// The restart backoff grows across quick kills and resets once the plugin served 10s
	// (pluginhost.DefaultResetAfter; issue 23: it reset only after a minute). Served means
	// connected: the time a slow start takes does not count.
	kill := func(what string) {
		t.Helper()
		p, _ := e.waitPluginProc("testplug")
		killed := time.Now()
		syscall.Kill(p.pid, syscall.SIGKILL)
		e.waitProvider("testplug", 60*time.Second, func(s api.ProviderStatus) bool {
			return s.Connected && s.ConnectedAt != nil && s.ConnectedAt.After(killed)
		}, "not connected again after SIGKILL "+what)
	}
	kill("right after the first restart")
	if !strings.Contains(e.kloudOut.String(), "attempt=2") {
		t.Errorf("a kill right after a restart did not grow the backoff (attempt=2):\n%s", e.kloudOut)
	}
	time.Sleep(10*time.Second + 500*time.Millisecond)
	before := strings.Count(e.kloudOut.String(), `msg="provider plugin exited; restarting it"`)
	kill("after 10s of service")
	lines := strings.Split(e.kloudOut.String(), "\n")
	var last string
	for _, l := range lines {
		if strings.Contains(l, `msg="provider plugin exited; restarting it"`) {
			last = l
		}
	}
	if strings.Count(e.kloudOut.String(), `msg="provider plugin exited; restarting it"`) != before+1 || !strings.Contains(last, "attempt=1") {
		t.Errorf("the restart after 10s of service did not reset the backoff: %s", last)
	}

	// A new binary (install again): kloud restarts the plugin from it; install waits for that.
	out = e.run("provider", "install", testPluginBin(t), "--name", "testplug", "--wait", "60s")
	if !strings.Contains(out, "provider testplug: connected") || !strings.Contains(e.kloudOut.String(), "binary replaced: restarting it") {
		t.Errorf("install over a running plugin:\n%s", out)
	}

	// Shutdown: SIGTERM to kloud stops the plugin; nothing of it is left.
	_, procs := e.pluginProcs("testplug")
	if len(procs) < 3 {
		t.Errorf("want launcher, init and plugin, got %v", procs)
	}
	e.kloud.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { e.kloud.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("kloud did not stop within 30s")
	}
	for _, p := range procs {
		if p.alive() {
			t.Errorf("left running after kloud stopped: %s", p)
		}
	}
	if !strings.Contains(e.kloudOut.String(), "provider plugin stopped") {
		t.Errorf("kloud's log does not say it stopped the plugin:\n%s", e.kloudOut)
	}
}

// TestPluginVersionMismatch: a plugin that speaks only plugin API version 99 is refused; kloud's
// log and provider list say which versions each side speaks.
func TestPluginVersionMismatch(t *testing.T) {
	parallel(t)
	e := newPluginEnv(t)
	e.run("provider", "install", testPluginBin(t), "--name", "badver", "--wait", "0")
	st := e.waitProvider("badver", 30*time.Second, func(s api.ProviderStatus) bool {
		return strings.Contains(s.LastError, "99") && strings.Contains(s.LastError, "[1]")
	}, "lastError does not name both versions")
	t.Logf("provider list: %+v", st)
	if st.Connected {
		t.Errorf("a plugin of version 99 is connected")
	}
	if log := e.kloudOut.String(); !strings.Contains(log, "99") || !strings.Contains(log, "[1]") {
		t.Errorf("kloud's log does not name both versions:\n%s", log)
	}
}

// TestPluginRemote: a plugin started outside kloud with a key from `kloud key create --provider`
// registers and is listed connected, remote; its key can call no user method (-32002); when it
// exits it is listed not connected.
func TestPluginRemote(t *testing.T) {
	parallel(t)
	e := newPluginEnv(t)
	keyFile := filepath.Join(t.TempDir(), "remote.key")
	out := e.run("key", "create", "--provider", "remote", "--out", keyFile)
	t.Logf("key create: %s", out)

	dir := t.TempDir()
	bin := filepath.Join(dir, "kloud-provider-remote")
	copyFile(t, testPluginBin(t), bin, 0o755)
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "KLOUD_PLUGIN_URL=ws://" + e.addr + "/kite", "KLOUD_PLUGIN_KEY_FILE=" + keyFile}
	var pout testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &pout, &pout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	st := e.waitProvider("remote", 30*time.Second, func(s api.ProviderStatus) bool { return s.Connected }, "remote plugin not connected")
	t.Logf("provider list: %+v", st)
	if st.Kind != api.ProviderPlugin || strings.Contains(st.Where, "launched") || st.Version == "" {
		t.Errorf("remote plugin listed as %+v", st)
	}

	// The plugin key can call no user method.
	raw, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	c, err := k.Dial(t.Context(), e.url()+"/kite", kite.Auth{Type: kitekey.KindPluginKey, Key: strings.TrimSpace(string(raw))})
	if err != nil {
		t.Fatalf("dial with the plugin key: %v", err)
	}
	for _, m := range []string{api.MethodStackList, api.MethodCredentialList, api.MethodProviderList, api.MethodUserWhoami} {
		err := c.Call(t.Context(), m, map[string]any{}, &json.RawMessage{})
		var ke *kite.Error
		if !errors.As(err, &ke) || ke.Code != kite.CodePermission {
			t.Errorf("%s with a plugin key: want -32002, got %v", m, err)
		} else {
			t.Logf("%s with a plugin key: %v", m, err)
		}
	}
	c.Close(nil)

	// The plugin exits: listed, not connected.
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("remote plugin did not exit on SIGTERM:\n%s", pout.String())
	}
	st = e.waitProvider("remote", 30*time.Second, func(s api.ProviderStatus) bool { return !s.Connected }, "still connected after its exit")
	t.Logf("after the plugin exited: %+v", st)
}

// TestPluginKilledMidBuild: a plugin killed while kloud waits for its ApplyTemplate fails the
// build's step with a reason naming the plugin; the stack ends Failed.
func TestPluginKilledMidBuild(t *testing.T) {
	parallel(t)
	e := newPluginEnv(t)
	e.run("provider", "install", testPluginBin(t), "--name", "blocky", "--wait", "60s")
	tid := e.template(`
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho hi"
}
`)
	var created struct{ Stack struct{ ID string } }
	e.runJSON(&created, "stack", "create", "--template", tid)
	out := e.run("stack", "apply", created.Stack.ID, "--detach")
	jobID := strings.Fields(strings.TrimPrefix(out, "job "))[0]
	testutil.Eventually(t, 60*time.Second, func() bool {
		return strings.Contains(e.kloudOut.String(), "testplugin applyTemplate blocking")
	}, "the build never reached the plugin's ApplyTemplate:\n%s", e.kloudOut)
	proc, _ := e.waitPluginProc("blocky")
	syscall.Kill(proc.pid, syscall.SIGKILL)

	var job api.Job
	testutil.Eventually(t, 60*time.Second, func() bool {
		e.runJSON(&job, "job", "get", jobID)
		return job.Status.Done()
	}, "the build did not end after the plugin was killed")
	t.Logf("job: %s: %s", job.Status, job.Error)
	if job.Status != api.JobFailed || !strings.Contains(job.Error, "blocky") {
		t.Errorf("job %s: %s (%s); want failed, naming the plugin", jobID, job.Status, job.Error)
	}
	var sv struct{ State string }
	e.runJSON(&sv, "stack", "describe", created.Stack.ID)
	if sv.State != "Failed" {
		t.Errorf("stack after the plugin died mid-build: %+v", sv)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// TestPluginUnsandboxedAndBuiltinName: `kloud serve --plugin-unsandboxed NAME` runs that plugin
// with kloud's privileges, logged at WARN; a plugin named like an in-tree provider is not
// launched, and says why in kloud's log.
func TestPluginUnsandboxedAndBuiltinName(t *testing.T) {
	parallel(t)
	testutil.RequireRoot(t)
	e := newEnv(t, "--plugin-unsandboxed", "freeplug")
	e.run("provider", "install", testPluginBin(t), "--name", "freeplug", "--wait", "60s")
	probe, ok := e.logProbe("freeplug")
	if !ok || probe.UID != 0 {
		t.Errorf("unsandboxed plugin: probe %+v (found %v), want uid 0", probe, ok)
	}
	if log := e.kloudOut.String(); !strings.Contains(log, "level=WARN") || !strings.Contains(log, "WITHOUT its sandbox") {
		t.Errorf("kloud's log does not warn about the unsandboxed plugin:\n%s", log)
	}
	if st := e.providers()["freeplug"]; !st.Connected || !strings.Contains(st.Where, "unsandboxed") {
		t.Errorf("provider list: %+v", st)
	}

	e.run("provider", "install", testPluginBin(t), "--name", "dummy", "--wait", "0")
	testutil.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(e.kloudOut.String(), "built into kloud")
	}, "kloud did not refuse a plugin named like the dummy provider:\n%s", e.kloudOut)
	if _, procs := e.pluginProcs("dummy"); len(procs) != 0 {
		t.Errorf("a plugin named dummy runs: %v", procs)
	}
	if st := e.providers()["dummy"]; st.Kind != api.ProviderBuiltin || !st.Connected {
		t.Errorf("the in-tree dummy provider: %+v", st)
	}
}

// TestPluginWithoutRoot: a kloud without root cannot sandbox plugins and does not fall back to
// running them unsandboxed: provider list says why and what to do; with
// --plugin-insecure-no-sandbox (development) they run, with kloud's own privileges, and kloud
// warns.
func TestPluginWithoutRoot(t *testing.T) {
	parallel(t)
	testutil.RequireRoot(t) // to run kloud as another user
	const nobody = 65534
	for _, insecure := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "insecure"}[insecure], func(t *testing.T) {
			testutil.RequireBinary(t, "terraform")
			dir := t.TempDir()
			// kloud runs as nobody: its data dir is nobody's, and the way to it open.
			os.Chmod(filepath.Dir(dir), 0o755)
			os.Chown(dir, nobody, nobody)
			e := &env{t: t, dir: dir, addr: testutil.FreeLoopback(t), noDummy: true, uid: nobody,
				extra: []string{"--terraformer-url", "http://127.0.0.1:1", "--no-demo"}}
			if insecure {
				e.extra = append(e.extra, "--plugin-insecure-no-sandbox")
			}
			e.start()
			t.Cleanup(e.cleanup)
			if !insecure {
				e.run("provider", "install", testPluginBin(t), "--name", "rootless", "--wait", "0")
				st := e.waitProvider("rootless", 30*time.Second, func(s api.ProviderStatus) bool { return s.LastError != "" },
					"no error for a plugin kloud cannot sandbox")
				t.Logf("provider list: %+v", st)
				if st.Connected || !strings.Contains(st.LastError, "--plugin-insecure-no-sandbox") || !strings.Contains(st.LastError, "root") {
					t.Errorf("provider list: %+v", st)
				}
				if _, procs := e.pluginProcs("rootless"); len(procs) != 0 {
					t.Errorf("kloud without root started the plugin: %v", procs)
				}
				return
			}
			e.run("provider", "install", testPluginBin(t), "--name", "rootless", "--wait", "60s")
			st := e.providers()["rootless"]
			probe, _ := e.logProbe("rootless")
			t.Logf("provider list: %+v; probe %+v", st, probe)
			if !st.Connected || !strings.Contains(st.Where, "unsandboxed") || probe.UID != nobody {
				t.Errorf("insecure plugin: %+v, probe %+v", st, probe)
			}
			if !strings.Contains(e.kloudOut.String(), "WITHOUT their sandbox") {
				t.Errorf("kloud does not warn that plugins run without their sandbox:\n%s", e.kloudOut)
			}
		})
	}
}
