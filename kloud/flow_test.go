package kloud_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// flowEnv is a kloud with a per-test dummy provider, a real terraformer and real klient
// processes as machines.
type flowEnv struct {
	*kloudtest.Env
	t     *testing.T
	dir   string
	tfDir string // terraformer's engine directory (stacks/<content id>/work: a stack's stored files)
	alice *kite.Conn
}

// client is alice's typed client, on alice's connection.
func (f *flowEnv) client() *api.Client { return api.NewClient(f.alice) }

// addUsers adds each user to the default team, with the password "<name>-password" if
// passwords is set (else kite keys only).
func addUsers(t *testing.T, e *kloudtest.Env, passwords bool, names ...string) {
	t.Helper()
	for _, u := range names {
		p := api.UserAddParams{Username: u, Team: model.DefaultTeam}
		if passwords {
			p.Password = u + "-password"
		}
		if _, err := e.Client(kloud.Admin).UserAdd(t.Context(), p); err != nil {
			t.Fatalf("user.add %s: %v", u, err)
		}
	}
}

func newFlow(t *testing.T, o dummy.Options) *flowEnv {
	t.Helper()
	return newFlowWith(t, o, kloudtest.Options{})
}

// dummyDir is a directory for the dummy provider's machines (dummy.Options.Dir) whose processes
// end with the test, also when it fails before destroying its stack.
func dummyDir(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "machines")
	t.Cleanup(func() {
		if err := dummy.KillAll(context.Background(), dir); err != nil {
			t.Error(err)
		}
	})
	return dir
}

// newFlowWith is newFlow with kloud's options (e.g. a short AgentTimeout).
func newFlowWith(t *testing.T, o dummy.Options, ko kloudtest.Options) *flowEnv {
	t.Helper()
	return newFlowProvider(t, o, ko, nil)
}

// newFlowProvider is newFlowWith with the dummy provider changed by tweak (nil: as it is)
// before it is registered: a test's Buckets.
func newFlowProvider(t *testing.T, o dummy.Options, ko kloudtest.Options, tweak func(*provider.Provider)) *flowEnv {
	t.Helper()
	testutil.RequireBinary(t, "curl")
	reg := provider.NewRegistry()
	o.Dir = dummyDir(t)
	p := dummy.New(o)
	if tweak != nil {
		tweak(p)
	}
	reg.Register(p)
	ko.Providers, ko.KlientBin = reg, testutil.BuildBinary(t, "./cmd/klient")
	e := kloudtest.Start(t, ko)
	tfDir := filepath.Join(t.TempDir(), "terraformer")
	e.StartTerraformerWith(tfrun.Options{Dir: tfDir})
	if _, err := e.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	alice := e.Dial("alice")
	f := &flowEnv{Env: e, t: t, dir: o.Dir, tfDir: tfDir, alice: alice}
	t.Cleanup(f.killMachines)
	return f
}

// killMachines stops any klient a failed test left running (by the pids in machine roots).
func (f *flowEnv) killMachines() {
	filepath.Walk(f.dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && (fi.Name() == "klient-supervisor.pid" || fi.Name() == "provision.pid") {
			b, _ := os.ReadFile(p)
			var pid int
			if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 1 {
				killGroup(pid)
			}
		}
		return nil
	})
}

func (f *flowEnv) credential() string {
	res, err := f.client().CredentialAdd(f.t.Context(), api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"s3cret-token"}`)})
	if err != nil {
		f.t.Fatal(err)
	}
	return res.ID
}

func (f *flowEnv) template(main string) string {
	t, err := f.client().TemplateCreate(f.t.Context(), api.TemplateParams{Title: "two vms", Files: map[string]string{"main.tf": main}})
	if err != nil {
		f.t.Fatal(err)
	}
	return t.ID
}

func (f *flowEnv) stack(tmplID string) (string, []model.Machine) {
	res, err := f.client().StackCreate(f.t.Context(), api.StackPlanParams{TemplateID: tmplID})
	if err != nil {
		f.t.Fatal(err)
	}
	return res.Stack.ID, res.Machines
}

// follow watches a job to its end and returns the last event.
func (f *flowEnv) follow(jobID string) api.JobEvent {
	f.t.Helper()
	last, err := f.followErr(jobID)
	if err != nil {
		f.t.Fatal(err)
	}
	return last
}

// followErr is follow that returns the watch's error instead of failing the test.
func (f *flowEnv) followErr(jobID string) (api.JobEvent, error) {
	ctx, cancel := context.WithTimeout(f.t.Context(), 5*time.Minute)
	defer cancel()
	var last api.JobEvent
	w, err := f.client().JobWatch(ctx, api.JobRef{JobID: jobID})
	if err != nil {
		return last, fmt.Errorf("watch job %s: %w", jobID, err)
	}
	defer w.Close()
	for {
		ev, err := w.Next(ctx)
		if errors.Is(err, kite.ErrStreamEnded) {
			return last, nil
		}
		if err != nil {
			return last, fmt.Errorf("watch job %s: %w", jobID, err)
		}
		last = ev
		for _, l := range last.Log {
			f.t.Logf("job %s: %s", jobID, l)
		}
	}
}

func (f *flowEnv) machines(stackID string) map[string]model.Machine {
	res, err := f.client().MachineList(f.t.Context(), api.MachineListParams{StackID: stackID})
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]model.Machine{}
	for _, m := range res.Machines {
		out[m.Label] = m
	}
	return out
}

const twoVMs = `
resource "terraform_data" "vm" {
  count = 2
  input = <<-EOT
    #!/bin/bash
    echo "hello from the user script of $KLOUD_OWNER"
  EOT
}
`

func TestStackLifecycle(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	tid := f.template(twoVMs)

	c := f.client()
	plan, err := c.StackPlan(t.Context(), api.StackPlanParams{TemplateID: tid})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Machines) != 2 || plan.Machines[0].Label != "vm.0" || plan.Machines[1].Label != "vm.1" || plan.Machines[0].Provider != "dummy" {
		t.Fatalf("plan: %+v", plan.Machines)
	}

	sid, ms := f.stack(tid)
	for _, m := range ms {
		if m.State != provider.NotInitialized || m.Agent.Status != model.AgentNever {
			t.Fatalf("new machine %+v", m)
		}
	}
	job, err := c.StackApply(t.Context(), api.StackApplyParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	last := f.follow(job.JobID)
	if last.Status != "succeeded" || last.Percentage != 100 {
		t.Fatalf("build: %+v", last)
	}
	// Neither the credential's secret nor any machine's kite key (a JWT) shows in what users
	// can read about the build (the raw answers).
	for _, c := range []struct {
		method string
		params any
	}{{"job.get", job}, {"stack.describe", api.StackRef{StackID: sid}}, {"machine.list", api.MachineListParams{StackID: sid}}} {
		var raw json.RawMessage
		kloudtest.Call(t, f.alice, c.method, c.params, &raw)
		if strings.Contains(string(raw), "s3cret-token") || strings.Contains(string(raw), "eyJ") {
			t.Fatalf("%s shows a secret: %s", c.method, raw)
		}
	}
	got := f.machines(sid)
	for _, l := range []string{"vm.0", "vm.1"} {
		m := got[l]
		if m.State != provider.Running || m.Agent.Status != model.AgentConnected || m.KiteID == "" {
			t.Fatalf("%s after build: %+v", l, m)
		}
		if len(f.Server.Kontrol.Lookup(kite.Identity{ID: m.KiteID})) != 1 {
			t.Fatalf("%s: agent not registered", l)
		}
	}

	// stop → Stopped, agent gone; start → Running, agent back.
	vm0 := got["vm.0"]
	if job, err = c.MachineStop(t.Context(), api.MachineRef{MachineID: vm0.ID}); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(job.JobID); last.Status != "succeeded" {
		t.Fatalf("stop: %+v", last)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		m := f.machines(sid)["vm.0"]
		return m.State == provider.Stopped && m.Agent.Status == model.AgentDisconnected
	}, "vm.0 not stopped with its agent disconnected: %+v", f.machines(sid)["vm.0"])
	info, err := c.MachineInfo(t.Context(), api.MachineRef{MachineID: vm0.ID})
	if err != nil {
		t.Fatal(err)
	}
	if info.InfraState != provider.Stopped {
		t.Fatalf("info: %+v", info)
	}
	if job, err = c.MachineStart(t.Context(), api.MachineRef{MachineID: vm0.ID}); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(job.JobID); last.Status != "succeeded" {
		t.Fatalf("start: %+v", last)
	}
	if m := f.machines(sid)["vm.0"]; m.State != provider.Running || m.Agent.Status != model.AgentConnected {
		t.Fatalf("after start: %+v", m)
	}
	// start is allowed only from Stopped.
	if _, err := c.MachineStart(t.Context(), api.MachineRef{MachineID: vm0.ID}); !errors.Is(err, kite.ErrState) {
		t.Fatalf("start of a running machine: %v", err)
	}

	if job, err = c.StackApply(t.Context(), api.StackApplyParams{StackID: sid, Destroy: true}); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(job.JobID); last.Status != "succeeded" {
		t.Fatalf("destroy: %+v", last)
	}
	if n := len(f.machines(sid)); n != 0 {
		t.Fatalf("%d machines left after destroy", n)
	}
	entries, _ := os.ReadDir(filepath.Join(f.dir, sid))
	if len(entries) != 0 {
		t.Fatalf("machine directories left after destroy: %v", entries)
	}
	for _, m := range got {
		if len(f.Server.Kontrol.Lookup(kite.Identity{ID: m.KiteID})) != 0 {
			t.Fatalf("agent %s still registered after destroy", m.Label)
		}
	}
}

func TestUserScriptFailureNamesTheStep(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	tid := f.template(`
resource "terraform_data" "web" {
  input = "#!/bin/bash\necho about to fail; echo boom-42 >&2; exit 3"
}
`)
	sid, _ := f.stack(tid)
	job, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	last := f.follow(job.JobID)
	if last.Status != "failed" || !strings.Contains(last.Error, "user script failed (exit code 3)") || !strings.Contains(last.Error, "boom-42") {
		t.Fatalf("want a user script failure with its output, got %+v", last)
	}
	m := f.machines(sid)["web"]
	if !strings.Contains(m.Reason, "user script") || m.Agent.Status != model.AgentConnected {
		t.Fatalf("machine: %+v", m)
	}
}

// TestFailedApplyRecordsWhatItMade: terraform apply fails after it made the machine (a resource
// after it fails): the build fails, and the machine is recorded with what terraform's state says
// of it (its id), in Unknown, so the store agrees with the state (TestChaos found a provider
// plugin killed during the boot provisioner leaving a machine only the state knew); the stack
// is then destroyed, the machine with it.
func TestFailedApplyRecordsWhatItMade(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	tid := f.template(`
resource "terraform_data" "web" {
  input = "#!/bin/bash\necho hi"
}
resource "terraform_data" "after" {
  input = terraform_data.web.id
  lifecycle {
    postcondition {
      condition     = self.output == "never"
      error_message = "failing after the machine"
    }
  }
}
`)
	sid, _ := f.stack(tid)
	job, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(job.JobID); last.Status != "failed" || !strings.Contains(last.Error, "failing after the machine") {
		t.Fatalf("want a failed terraform apply, got %+v", last)
	}
	m := f.machines(sid)["web"]
	if id, _ := m.Attributes["id"].(string); id == "" || m.State != provider.Unknown {
		t.Fatalf("the machine terraform made before failing: %s, attributes %v", m.State, m.Attributes)
	}
	destroy, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid, Destroy: true})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(destroy.JobID); last.Status != "succeeded" {
		t.Fatalf("destroy after the failed build: %+v", last)
	}
}

func TestBrokenAgentDownloadNamesTheStep(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{BreakAgent: "download"}, kloudtest.Options{AgentTimeout: 15 * time.Second})
	f.credential()
	tid := f.template(`
resource "terraform_data" "web" {
  input = "#!/bin/bash\necho hi"
}
`)
	sid, _ := f.stack(tid)
	job, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	last := f.follow(job.JobID)
	if last.Status != "failed" || !strings.Contains(last.Error, "agent download") || !strings.Contains(last.Error, "sha256 mismatch") {
		t.Fatalf("want an agent download failure, got %+v", last)
	}
}

func TestConcurrentApplyRunsOnce(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	sid, _ := f.stack(f.template(twoVMs))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var jobs []string
	var errs []error
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			job, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else {
				jobs = append(jobs, job.JobID)
			}
		}()
	}
	wg.Wait()
	if len(jobs) != 1 {
		t.Fatalf("%d applies started (errors %v)", len(jobs), errs)
	}
	for _, err := range errs {
		if !errors.Is(err, kite.ErrConflict) && !errors.Is(err, kite.ErrState) {
			t.Fatalf("loser got %v", err)
		}
	}
	if last := f.follow(jobs[0]); last.Status != "succeeded" {
		t.Fatalf("%+v", last)
	}
	job, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid, Destroy: true})
	if err != nil {
		t.Fatal(err)
	}
	f.follow(job.JobID)
}

func TestInvalidTemplates(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	_, err := f.client().TemplateCreate(t.Context(), api.TemplateParams{Title: "bad", Files: map[string]string{"main.tf": "resource \"terraform_data\" \"x\" {\n  input = \n}\n"}})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "main.tf:") {
		t.Fatalf("syntax error: %v", err)
	}
	// Valid HCL, but Terraform rejects it: the diagnostic comes back from the plan.
	tid := f.template(`
resource "terraform_data" "vm" {
  input = var.missing
}
`)
	_, err = f.client().StackPlan(t.Context(), api.StackPlanParams{TemplateID: tid})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "missing") || !strings.Contains(err.Error(), "main.tf") {
		t.Fatalf("terraform error: %v", err)
	}
}

func TestSecretsOnlyInProviderBlocks(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	tid := f.template(`
variable "dummy_token" {
  type      = string
  sensitive = true
}
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho ${var.dummy_token}"
}
`)
	_, err := f.client().StackPlan(t.Context(), api.StackPlanParams{TemplateID: tid})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "dummy_token") {
		t.Fatalf("a resource reading a secret: %v", err)
	}
}

// A build mints every machine's agent key and records the kite ids before any provider rewrites
// the template: a provider whose rewrite fails finds them recorded (and writes nothing itself),
// and the machines go back to where they were.
func TestKiteIDsRecordedBeforeProviderRewrite(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{Fail: map[string]error{"ApplyTemplate": errors.New("rewrite refused")}})
	f.credential()
	sid, _ := f.stack(f.template(twoVMs))
	job, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	last := f.follow(job.JobID)
	if last.Status != "failed" || !strings.Contains(last.Error, "rewrite refused") {
		t.Fatalf("want the provider's rewrite failure, got %+v", last)
	}
	seen := map[string]bool{}
	for label, m := range f.machines(sid) {
		if !strings.HasPrefix(m.KiteID, kloud.AgentKitePrefix) || seen[m.KiteID] {
			t.Errorf("%s: kite id %q, want a fresh agent kite id of its own", label, m.KiteID)
		}
		seen[m.KiteID] = true
		if m.Agent.Status != model.AgentNever || m.State != provider.NotInitialized {
			t.Errorf("%s: state %s, agent %+v; want NotInitialized, never seen", label, m.State, m.Agent)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("machines: %d kite ids", len(seen))
	}
}
