package kloud_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestStackUpdateRefusedAtTheCall: what an update job would refuse before changing anything is
// refused by stack.update and stack.scale themselves, with invalid params and no job: a scale to
// zero machines and a revision without machines (both say to destroy the stack instead), a
// revision Terraform refuses. The stack stays as it was and its lease is free (a destroy runs).
func TestStackUpdateRefusedAtTheCall(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
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
	built := jobs()
	refused := func(what string, ref api.JobRef, err error, want string) {
		t.Helper()
		if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: want invalid params saying %q, got job %q, %v", what, want, ref.JobID, err)
		}
		t.Logf("%s: %v", what, err)
		if n := jobs(); n != built {
			t.Fatalf("%s: %d jobs of the stack, want %d (no new one)", what, n, built)
		}
		view, err := c.StackDescribe(ctx, api.StackRef{StackID: sid})
		if err != nil {
			t.Fatal(err)
		}
		if view.State != model.StackInitialized || view.Reason != "" || view.TemplateRev != 1 || view.Diverged || len(view.Machines) != 1 {
			t.Fatalf("%s: stack is %s (%q), rev %d, diverged %v, %d machines", what, view.State, view.Reason, view.TemplateRev, view.Diverged, len(view.Machines))
		}
	}

	ref, err = c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "vm", Count: 0})
	refused("scale to zero", ref, err, "destroy the stack instead (kloud stack destroy "+sid+")")

	f.updateTemplate(tid, "variable \"x\" {\n  default = 1\n}\n")
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
	refused("update to a revision without machines", ref, err, "destroy the stack instead")
	if _, err := c.StackPlan(ctx, api.StackPlanParams{StackID: sid}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("plan of an update to a revision without machines: %v", err)
	}

	f.updateTemplate(tid, "resource \"terraform_data\" \"vm\" {\n  count = -1\n  input = \"x\"\n}\n")
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid, TemplateRevision: 3})
	refused("update to a revision Terraform refuses", ref, err, "terraform plan")

	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
	f.jobOK("destroy", ref, err)
}
