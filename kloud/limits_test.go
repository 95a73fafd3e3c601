package kloud_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// tfJobs returns the terraformer's jobs (its engine directory's jobs/*.json).
func tfJobs(t *testing.T, tfDir string) []tfapi.Job {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(tfDir, "jobs", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var out []tfapi.Job
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var j tfapi.Job
		if err := json.Unmarshal(b, &j); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out = append(out, j)
	}
	return out
}

// assertNoTerraform fails unless every terraformer job is over (within a deadline) and no
// process works under the terraformer's directory.
func assertNoTerraform(t *testing.T, tfDir string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var running []string
		for _, j := range tfJobs(t, tfDir) {
			if !j.Status.Final() {
				running = append(running, j.ID+" ("+j.ContentID+", "+string(j.Status)+")")
			}
		}
		if len(running) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("terraformer jobs still running: %v", running)
		}
		time.Sleep(100 * time.Millisecond)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, tfDir)
}

// countOfN is a template of var.n machines (default 2).
const countOfN = `
variable "n" {
  type    = number
  default = 2
}
resource "terraform_data" "vm" {
  count = var.n
}
`

// refusedCap checks a refusal of the machine cap: invalid params naming the limit, the count
// asked for and how to change the limit.
func refusedCap(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("%s: %v, want invalid params", what, err)
	}
	for _, w := range append(want, "--max-machines") {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", what, err, w)
		}
	}
	t.Logf("%s: refused: %v", what, err)
}

// TestMachineCapRefuses100000: the attack, a template of count = 100000, is refused at
// template.create (a literal, a variable's default) and at stack.plan and stack.create (a
// variable given by the caller) before terraform runs, with the limit's message; a count
// kloud cannot evaluate is refused on terraform's plan; a template's own cap, set by an
// administrator, replaces the global one. No terraform is left running.
func TestMachineCapRefuses100000(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{})
	f.credential()
	ctx := t.Context()
	cl := f.client()

	_, err := cl.TemplateCreate(ctx, api.TemplateParams{Title: "literal", Files: map[string]string{"main.tf": `
resource "terraform_data" "vm" {
  count = 100000
}
`}})
	refusedCap(t, "template.create of count = 100000", err, "asks for 100000 machines", "the limit is 20 machines per stack", "--max-machines-per-stack")
	_, err = cl.TemplateCreate(ctx, api.TemplateParams{Title: "default", Files: map[string]string{"main.tf": `
variable "n" {
  type    = number
  default = 100000
}
resource "terraform_data" "vm" {
  count = var.n
}
`}})
	refusedCap(t, "template.create of count = var.n (default 100000)", err, "asks for 100000 machines", "the limit is 20")

	small := f.template(countOfN)
	_, err = cl.StackPlan(ctx, api.StackPlanParams{TemplateID: small, Variables: map[string]string{"n": "100000"}})
	refusedCap(t, "stack.plan with n=100000", err, "asks for 100000 machines", "the limit is 20")
	_, err = cl.StackCreate(ctx, api.StackPlanParams{TemplateID: small, Variables: map[string]string{"n": "100000"}})
	refusedCap(t, "stack.create with n=100000", err, "asks for 100000 machines", "the limit is 20")
	if jobs := tfJobs(t, f.tfDir); len(jobs) != 0 {
		t.Fatalf("terraform ran for counts known before it: %d jobs", len(jobs))
	}

	// A count kloud does not evaluate (a function): terraform's plan counts the machines.
	dyn := f.template(`
resource "terraform_data" "vm" {
  count = max(21, 1)
}
`)
	_, err = cl.StackPlan(ctx, api.StackPlanParams{TemplateID: dyn})
	refusedCap(t, "stack.plan of count = max(21, 1)", err, "terraform's plan asks for 21 machines", "the limit is 20")

	// A stack made before its template's cap was lowered.
	made, err := cl.StackCreate(ctx, api.StackPlanParams{TemplateID: small})
	if err != nil {
		t.Fatal(err)
	}
	// A template's own cap: only a kloud administrator sets it; it replaces the global cap.
	if _, err := cl.TemplateUpdate(ctx, api.TemplateParams{TemplateID: small, MaxMachines: 1}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("template.update maxMachines by a member: %v, want permission denied", err)
	}
	admin := f.Client(kloud.Admin)
	if _, err := admin.TemplateUpdate(ctx, api.TemplateParams{TemplateID: small, MaxMachines: kloud.MaxMachinesCeiling + 1}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("template.update maxMachines above the ceiling: %v, want invalid params", err)
	}
	tp, err := admin.TemplateUpdate(ctx, api.TemplateParams{TemplateID: small, MaxMachines: 1})
	if err != nil || tp.MaxMachines != 1 {
		t.Fatalf("template.update maxMachines 1: %+v, %v", tp, err)
	}
	_, err = cl.StackPlan(ctx, api.StackPlanParams{TemplateID: small})
	refusedCap(t, "stack.plan of 2 machines under a template cap of 1", err, "asks for 2 machines", "the limit is 1 machine per stack", "template "+small)
	_, err = cl.StackCreate(ctx, api.StackPlanParams{TemplateID: small})
	refusedCap(t, "stack.create of 2 machines under a template cap of 1", err, "asks for 2 machines", "the limit is 1")
	if _, err := cl.StackPlan(ctx, api.StackPlanParams{TemplateID: small, Variables: map[string]string{"n": "1"}}); err != nil {
		t.Fatalf("stack.plan of 1 machine under a template cap of 1: %v", err)
	}
	ref, err := cl.StackApply(ctx, api.StackApplyParams{StackID: made.Stack.ID})
	refusedCap(t, "stack.apply of a 2-machine stack under a template cap of 1", err, "asks for 2 machines", "the limit is 1")
	if ref.JobID != "" {
		t.Fatalf("stack.apply refused with job %s", ref.JobID)
	}
	if l, err := cl.StackList(ctx, api.StackListParams{}); err != nil || len(l.Stacks) != 1 || l.Stacks[0].State != model.StackNotInitialized {
		t.Fatalf("stack.list after refused creates and apply: %+v, %v: want the one stack, not initialized", l, err)
	}
	assertNoTerraform(t, f.tfDir)
}

// TestMachineCapScaleAndUpdate: stack.scale of a built stack to 50 machines (its params allow
// up to 100) is refused
// before terraform runs; an update to a revision whose count only terraform knows is refused
// on its plan; neither starts a job or changes the stack.
func TestMachineCapScaleAndUpdate(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{})
	f.credential()
	c := f.client()
	ctx := t.Context()
	tid := f.template(`resource "terraform_data" "vm" {
  count = 1
  input = "#!/bin/bash\necho hi\n"
}
`)
	sid, _ := f.stack(tid)
	ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid})
	f.jobOK("build", ref, err)
	jobs := func() int {
		t.Helper()
		res, err := c.JobList(ctx, api.JobListParams{Target: "stack/" + sid})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Jobs)
	}
	built, tfBuilt := jobs(), len(tfJobs(t, f.tfDir))
	unchanged := func(what string) {
		t.Helper()
		if n := jobs(); n != built {
			t.Fatalf("%s: %d jobs of the stack, want %d (no new one)", what, n, built)
		}
		view, err := c.StackDescribe(ctx, api.StackRef{StackID: sid})
		if err != nil {
			t.Fatal(err)
		}
		if view.State != model.StackInitialized || view.Diverged || len(view.Machines) != 1 {
			t.Fatalf("%s: stack is %s (%q), diverged %v, %d machines", what, view.State, view.Reason, view.Diverged, len(view.Machines))
		}
	}

	ref, err = c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "vm", Count: 50})
	refusedCap(t, "stack.scale to 50", err, "asks for 50 machines", "the limit is 20")
	unchanged("stack.scale to 50")
	if n := len(tfJobs(t, f.tfDir)); n != tfBuilt {
		t.Fatalf("stack.scale to 50 ran terraform: %d terraformer jobs, want %d", n, tfBuilt)
	}

	f.updateTemplate(tid, "resource \"terraform_data\" \"vm\" {\n  count = max(25, 1)\n  input = \"x\"\n}\n")
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
	refusedCap(t, "stack.update to 25 machines", err, "terraform's plan asks for 25 machines", "the limit is 20")
	unchanged("stack.update to 25 machines")
	assertNoTerraform(t, f.tfDir)

	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
	f.jobOK("destroy", ref, err)
}

// TestPlanTimeoutKillsTerraform: a plan that outlives its caller (the call gives up) or the plan
// timeout is cancelled and leaves no terraform running. The count is one kloud cannot evaluate
// before terraform (a function), so terraform really plans 100000 machines.
func TestPlanTimeoutKillsTerraform(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{Limits: kloud.Limits{PlanTimeout: 4 * time.Second}})
	f.credential()
	cl := f.client()
	big := f.template(`
resource "terraform_data" "vm" {
  count = max(100000, 1)
}
`)
	// The caller gives up first.
	cctx, cancel := context.WithTimeout(t.Context(), time.Second)
	_, err := cl.StackPlan(cctx, api.StackPlanParams{TemplateID: big})
	cancel()
	if err == nil {
		t.Fatal("stack.plan of 100000 machines answered within a second")
	}
	t.Logf("caller gave up: %v", err)
	assertNoTerraform(t, f.tfDir)
	if n := len(tfJobs(t, f.tfDir)); n != 1 {
		t.Fatalf("%d terraformer jobs, want the one plan", n)
	}

	// The plan timeout.
	_, err = cl.StackPlan(t.Context(), api.StackPlanParams{TemplateID: big})
	if !errors.Is(err, kite.ErrTimeout) || !strings.Contains(err.Error(), "plan timeout") || !strings.Contains(err.Error(), "--plan-timeout") {
		t.Fatalf("stack.plan past the plan timeout: %v, want a timeout naming --plan-timeout", err)
	}
	t.Logf("plan timeout: %v", err)
	assertNoTerraform(t, f.tfDir)
	for _, j := range tfJobs(t, f.tfDir) {
		if j.Status != tfapi.StatusCancelled {
			t.Errorf("terraformer job %s: %s, want cancelled", j.ID, j.Status)
		}
	}
}
