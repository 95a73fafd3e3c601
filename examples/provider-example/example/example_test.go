package example_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/examples/provider-example/example"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain makes this test binary terraform's sandbox launcher (tfrun re-executes it).
func TestMain(m *testing.M) {
	tfsandbox.MaybeRun()
	os.Exit(m.Run())
}

// env is a real kloud (kloudtest: store, kontrol, a real terraformer running real terraform)
// with the example provider in-process, serving real klient; alice is a member of the default
// team.
type env struct {
	*kloudtest.Env
	t     *testing.T
	dir   string
	alice *api.Client
	// pluginDir is where kloud launches the plugin from ("" in-process).
	pluginDir string
}

// newEnv starts kloud with the example in its process or, with plugin, as the plugin binary
// kloud-provider-example that kloud's launcher starts from its plugin directory (sandboxed, as
// uid 65534: the machines' agents and their terminals' shells run as that user).
func newEnv(t *testing.T, plugin bool) *env {
	t.Helper()
	testutil.RequireBinary(t, "curl")
	testutil.RequireBinary(t, "bash")
	o := kloudtest.Options{Providers: provider.NewRegistry(), KlientBin: testutil.BuildBinary(t, "./cmd/klient"), DataDir: t.TempDir(),
		GC: kloud.GCOptions{Interval: -1, Grace: -1}} // gc.run (TestRemoved) judges every machine, however young
	dir := filepath.Join(t.TempDir(), "state")
	if plugin {
		testutil.RequireRoot(t) // the plugin's sandbox
		// The launcher gives the plugin the state directory <data dir>/plugin-state/example.
		dir = filepath.Join(o.DataDir, "plugin-state", "example")
		o.PluginDir = filepath.Join(t.TempDir(), "plugins")
		bin, err := os.ReadFile(testutil.BuildBinary(t, "./examples/provider-example"))
		if err == nil {
			err = os.MkdirAll(o.PluginDir, 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(o.PluginDir, "kloud-provider-example"), bin, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	} else {
		o.Providers.Register(example.New(example.Options{Dir: dir, Logger: testutil.Logger(t)}))
	}
	k := kloudtest.Start(t, o)
	e := &env{Env: k, t: t, dir: dir, pluginDir: o.PluginDir}
	t.Cleanup(e.killLeftovers)
	if plugin {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := k.Server.PluginHost().Wait(ctx, "example"); err != nil {
			t.Fatal(err)
		}
	}
	k.StartTerraformer()
	if _, err := k.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam, Password: "alice-password"}); err != nil {
		t.Fatal(err)
	}
	e.alice = k.Client("alice")
	return e
}

// killLeftovers kills the machine processes a failed test left (a passing one destroyed them).
func (e *env) killLeftovers() {
	for _, pid := range machineProcs(e.dir + "/") {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// machineProcs lists the processes of the example's machines whose directory starts with
// prefix (their environment names their machine's directory).
func machineProcs(prefix string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + en.Name() + "/environ")
		if err == nil && bytes.Contains(b, []byte("KLOUD_EXAMPLE_MACHINE="+prefix)) {
			out = append(out, pid)
		}
	}
	return out
}

func (e *env) follow(jobID string) api.JobEvent {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 5*time.Minute)
	defer cancel()
	w, err := e.alice.JobWatch(ctx, api.JobRef{JobID: jobID})
	if err != nil {
		e.t.Fatalf("watch job %s: %v", jobID, err)
	}
	defer w.Close()
	var last api.JobEvent
	for {
		ev, err := w.Next(ctx)
		if errors.Is(err, kite.ErrStreamEnded) {
			return last
		}
		if err != nil {
			e.t.Fatalf("watch job %s: %v", jobID, err)
		}
		last = ev
		for _, l := range ev.Log {
			e.t.Logf("job %s: %s", jobID, l)
		}
	}
}

func (e *env) succeed(ref api.JobRef, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
	if last := e.follow(ref.JobID); last.Status != "succeeded" {
		e.t.Fatalf("job %s: %+v", ref.JobID, last)
	}
}

// build makes alice a template of mainTF and a stack of it, and builds the stack.
func (e *env) build(title, mainTF string) (templateID, stackID string) {
	e.t.Helper()
	tpl, err := e.alice.TemplateCreate(e.t.Context(), api.TemplateParams{Title: title, Files: map[string]string{"main.tf": mainTF}})
	if err != nil {
		e.t.Fatal(err)
	}
	st, err := e.alice.StackCreate(e.t.Context(), api.StackPlanParams{TemplateID: tpl.ID})
	if err != nil {
		e.t.Fatal(err)
	}
	e.succeed(e.alice.StackApply(e.t.Context(), api.StackApplyParams{StackID: st.Stack.ID}))
	return tpl.ID, st.Stack.ID
}

func (e *env) machines(stackID string) map[string]model.Machine {
	e.t.Helper()
	res, err := e.alice.MachineList(e.t.Context(), api.MachineListParams{StackID: stackID})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]model.Machine{}
	for _, m := range res.Machines {
		out[m.Label] = m
	}
	return out
}

// terminal opens machineID's terminal through kloud as a browser does (login, cookie, WebSocket).
func (e *env) terminal(machineID string) *webtermtest.Term {
	e.t.Helper()
	body, _ := json.Marshal(map[string]string{"username": "alice", "password": "alice-password"})
	resp, err := http.Post(e.URL+"/api/login", "application/json", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	h := http.Header{"Origin": {e.URL}}
	for _, c := range resp.Cookies() {
		h.Set("Cookie", c.Name+"="+c.Value)
	}
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, e.URL+"/api/machines/"+machineID+"/terminal?cols=100&rows=30", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		msg := ""
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			msg = resp.Status + " " + string(b)
		}
		e.t.Fatalf("open terminal: %v %s", err, msg)
	}
	e.t.Cleanup(func() { ws.CloseNow() })
	return webtermtest.NewTerm(ws)
}

const twoMachines = `
resource "terraform_data" "vm" {
  count = 2
  input = <<-EOT
    #!/bin/bash
    echo "hello from $(hostname -s 2>/dev/null || true) of $KLOUD_OWNER"
  EOT
}
`

// The example provider through a whole life, in kloud's process and as a plugin: credentials
// verified (a good one accepted, one above the host's capacity refused with the provider's
// reason, an invalid one refused at add), the team's network bootstrapped twice with the same
// id, a 2-machine stack built to Running with both agents connected, a terminal opened, a file
// written there kept across stop and start, a machine whose processes died behind kloud's back
// reported Stopped and started again, and destroy leaving no directory and no process.
func TestExample(t *testing.T) {
	t.Parallel()
	t.Run("InProcess", func(t *testing.T) { testExample(t, false) })
	t.Run("Plugin", func(t *testing.T) { testExample(t, true) })
}

func testExample(t *testing.T, plugin bool) {
	e := newEnv(t, plugin)
	ctx := t.Context()

	if _, err := e.alice.CredentialAdd(ctx, api.CredentialAddParams{Provider: "example", Title: "bad", Data: json.RawMessage(`{"label":"Not OK","maxMachines":2}`)}); err == nil || !strings.Contains(err.Error(), "lowercase") {
		t.Fatalf("invalid label: %v", err)
	}
	big, err := e.alice.CredentialAdd(ctx, api.CredentialAddParams{Provider: "example", Title: "big", Data: json.RawMessage(`{"label":"big","maxMachines":16}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := e.alice.CredentialAuthenticate(ctx, api.CredentialRef{CredentialID: big.ID}); err != nil || res.Verified || !strings.Contains(res.Error, "more than this host allows (8)") {
		t.Fatalf("authenticate a credential above capacity: %+v %v", res, err)
	}
	if _, err := e.alice.CredentialRemove(ctx, api.CredentialRef{CredentialID: big.ID}); err != nil {
		t.Fatal(err)
	}
	cred, err := e.alice.CredentialAdd(ctx, api.CredentialAddParams{Provider: "example", Title: "mine", Data: json.RawMessage(`{"label":"red"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := e.alice.CredentialAuthenticate(ctx, api.CredentialRef{CredentialID: cred.ID}); err != nil || !res.Verified {
		t.Fatalf("authenticate: %+v %v", res, err)
	}
	b, err := e.alice.CredentialBootstrap(ctx, api.CredentialBootstrapParams{CredentialID: cred.ID})
	e.succeed(api.JobRef{JobID: b.JobID}, err)

	_, sid := e.build("two", twoMachines)
	ms := e.machines(sid)
	var network string
	for _, l := range []string{"vm.0", "vm.1"} {
		m := ms[l]
		if m.State != provider.Running || m.Agent.Status != model.AgentConnected || len(e.Server.Kontrol.Lookup(kite.Identity{ID: m.KiteID})) != 1 {
			t.Fatalf("%s after build: %+v", l, m)
		}
		n, err := os.ReadFile(filepath.Join(e.dir, "machines", sid, l, "etc/kloud-example/network"))
		if err != nil || !strings.HasPrefix(string(n), "red-net-") || network != "" && string(n) != network {
			t.Fatalf("%s network %q: %v", l, n, err)
		}
		network = string(n)
	}
	// Bootstrapping again changes nothing: same network.
	b, err = e.alice.CredentialBootstrap(ctx, api.CredentialBootstrapParams{CredentialID: cred.ID})
	if err != nil || !b.AlreadyDone {
		t.Fatalf("bootstrap again: %+v %v", b, err)
	}

	// The agent's terminal opens; what is written to the disk survives stop and start.
	vm0 := ms["vm.0"]
	term := e.terminal(vm0.ID)
	term.Type(t, "echo kept-$((6*7)) > ~/kept.txt && echo written-$((2+3))\r")
	term.WaitFor(t, "written-5") // not in the echo of what was typed: the command ran
	e.succeed(e.alice.MachineStop(ctx, api.MachineRef{MachineID: vm0.ID}))
	info, err := e.alice.MachineInfo(ctx, api.MachineRef{MachineID: vm0.ID})
	if err != nil || info.InfraState != provider.Stopped {
		t.Fatalf("info after stop: %+v %v", info, err)
	}
	e.succeed(e.alice.MachineStart(ctx, api.MachineRef{MachineID: vm0.ID}))
	if m := e.machines(sid)["vm.0"]; m.State != provider.Running || m.Agent.Status != model.AgentConnected {
		t.Fatalf("after start: %+v", m)
	}
	term = e.terminal(vm0.ID)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("terminal open %v, notices %q", term.Open(), term.Notices())
			b, _ := os.ReadFile(filepath.Join(e.dir, "machines", sid, "vm.0", "var/log/kloud/klient.log"))
			t.Logf("vm.0's klient log:\n%s", b)
		}
	})
	term.Type(t, "cat ~/kept.txt\r")
	term.WaitFor(t, "kept-42")

	// Behind kloud's back (as when a plugin restarts and its machines' processes died with
	// it): the machine's processes are killed; Info says Stopped, and start brings it back.
	vm1 := ms["vm.1"]
	for _, pid := range machineProcs(filepath.Join(e.dir, "machines", sid, "vm.1")) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		info, err := e.alice.MachineInfo(ctx, api.MachineRef{MachineID: vm1.ID})
		return err == nil && info.InfraState == provider.Stopped
	}, "vm.1 not reported Stopped after its processes died")
	e.succeed(e.alice.MachineStart(ctx, api.MachineRef{MachineID: vm1.ID}))
	if m := e.machines(sid)["vm.1"]; m.State != provider.Running || m.Agent.Status != model.AgentConnected {
		t.Fatalf("vm.1 after start: %+v", m)
	}

	e.succeed(e.alice.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true}))
	if _, err := os.Stat(filepath.Join(e.dir, "machines", sid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stack directory after destroy: %v", err)
	}
	if p := machineProcs(e.dir + "/"); len(p) != 0 {
		t.Fatalf("machine processes after destroy: %v", p)
	}
}
