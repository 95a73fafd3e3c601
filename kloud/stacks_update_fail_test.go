package kloud_test

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// slowRev is a template of dummy machines: "keep" as updateRev writes it (it never changes),
// "chg" if withChg, and n "vm"s whose user script sleeps (kloud waits for their agents a while).
func slowRev(n int, withChg bool) string {
	out := updateRev("1", 0, withChg)
	if n > 0 {
		out += `resource "terraform_data" "vm" {
  count = ` + string(rune('0'+n)) + `
  input = <<-EOT
    #!/bin/bash
    echo slow; sleep 6; echo done
  EOT
}
`
	}
	return out
}

// cancelAt starts what start returns and cancels the job once it reached stage (or ended).
func (f *flowEnv) cancelAt(ref api.JobRef, err error, stage stackbuild.Stage) api.JobEvent {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
	c := f.client()
	testutil.Eventually(f.t, 2*time.Minute, func() bool {
		j, err := c.JobGet(f.t.Context(), ref)
		return err == nil && (j.Percent >= stage.Percent() || j.Status != "running")
	}, "job %s did not reach %q", ref.JobID, stage)
	if _, err := c.JobCancel(f.t.Context(), ref); err != nil && !errors.Is(err, kite.ErrState) {
		f.t.Fatal(err)
	}
	return f.follow(ref.JobID)
}

// TestStackUpdateInterruptedThenApplied: updates cancelled while terraform runs and while kloud
// waits for the agents leave the stack Failed with records that do not match its files (new
// machines not built, removed ones not gone); stack.apply then converges it as an update of its
// own files: the unchanged machine keeps its record, key and agent process, the new machines
// end Running, removed records go (and the machine of a resource the revision drops entirely),
// no label is recorded twice; destroy leaves nothing. Also: another user's stack, another
// template, a revision that does not exist, an update or apply while a job holds the stack, and
// a revision without machines are refused and change nothing.
func TestStackUpdateInterruptedThenApplied(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	c := f.client()
	ctx := t.Context()
	tid := f.template(slowRev(0, true))
	sid, _ := f.stack(tid)
	ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid})
	f.jobOK("build", ref, err)
	keep := f.machines(sid)["keep"]
	keepPID := f.supervisorPID(sid, "keep")

	// Refused, changing nothing: another user's stack, a revision that does not exist.
	if _, err := f.Client(kloud.Admin).UserAdd(ctx, api.UserAddParams{Username: "bob", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	bob := api.NewClient(f.Dial("bob"))
	if _, err := bob.StackUpdate(ctx, api.StackUpdateParams{StackID: sid}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("bob's update of alice's stack: %v", err)
	}
	if _, err := bob.StackPlan(ctx, api.StackPlanParams{StackID: sid}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("bob's plan of alice's stack: %v", err)
	}
	if _, err := c.StackPlan(ctx, api.StackPlanParams{StackID: sid, TemplateID: "another"}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("plan of a stack with another template: %v", err)
	}
	if _, err := c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid, TemplateRevision: 99}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("update to a revision that does not exist: %v", err)
	}

	// A revision without machines: refused at the call, saying to destroy instead; the stack is
	// as it was.
	f.updateTemplate(tid, "variable \"x\" {\n  default = 1\n}\n")
	if _, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid}); !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "destroy the stack instead") {
		t.Fatalf("update to a revision without machines: %v", err)
	}
	if view, _ := c.StackDescribe(ctx, api.StackRef{StackID: sid}); view.State != model.StackInitialized || view.TemplateRev != 1 || len(view.Machines) != 2 {
		t.Fatalf("stack after an update to no machines: %s (%s), rev %d, %d machines", view.State, view.Reason, view.TemplateRev, len(view.Machines))
	}

	for _, tc := range []struct {
		name    string
		stage   stackbuild.Stage
		vms     int
		want    []string
		removed string
	}{
		{"while terraform runs", stackbuild.BuildResources, 1, []string{"keep", "vm.0"}, "chg"},
		{"while waiting for the agents", stackbuild.BuildAgents, 2, []string{"keep", "vm.0", "vm.1"}, ""},
	} {
		f.updateTemplate(tid, slowRev(tc.vms, false))
		ref, err := c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
		// One job per stack: an apply or another update meanwhile is refused.
		if _, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid}); !errors.Is(err, kite.ErrConflict) && !errors.Is(err, kite.ErrState) {
			t.Fatalf("%s: apply during an update: %v", tc.name, err)
		}
		if _, err := c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid}); !errors.Is(err, kite.ErrConflict) && !errors.Is(err, kite.ErrState) {
			t.Fatalf("%s: update during an update: %v", tc.name, err)
		}
		last := f.cancelAt(ref, err, tc.stage)
		view, _ := c.StackDescribe(ctx, api.StackRef{StackID: sid})
		t.Logf("%s: job %s (%s); stack %s (%s)", tc.name, last.Status, last.Error, view.State, view.Reason)
		for _, m := range view.MachineDocs {
			if m.State.InProgress() {
				t.Fatalf("%s: machine %s is %s after the cancel", tc.name, m.Label, m.State)
			}
		}
		ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: sid})
		f.jobOK(tc.name+": apply after the cancelled update", ref, err)
		if j, err := c.JobGet(ctx, ref); err != nil || (view.State == model.StackFailed && j.Kind != "stack.update") {
			t.Fatalf("%s: the apply ran as %+v (%v), want an update of the stack's files", tc.name, j.Kind, err)
		}
		view, _ = c.StackDescribe(ctx, api.StackRef{StackID: sid})
		var labels []string
		for _, m := range view.MachineDocs {
			labels = append(labels, m.Label)
			if m.State != provider.Running || m.Agent.Status != model.AgentConnected {
				t.Errorf("%s: %s after the apply: %s (%s), agent %s", tc.name, m.Label, m.State, m.Reason, m.Agent.Status)
			}
		}
		slices.Sort(labels)
		if !slices.Equal(labels, tc.want) || len(view.Machines) != len(tc.want) || view.State != model.StackInitialized {
			t.Fatalf("%s: after the apply: %s (%s), machines %v (stack lists %d)", tc.name, view.State, view.Reason, labels, len(view.Machines))
		}
		k := f.machines(sid)["keep"]
		if k.ID != keep.ID || k.KiteID != keep.KiteID || f.supervisorPID(sid, "keep") != keepPID {
			t.Fatalf("%s: keep changed: %+v, pid %s (was %s)", tc.name, k, f.supervisorPID(sid, "keep"), keepPID)
		}
		if tc.removed != "" {
			if _, err := os.Stat(f.dir + "/" + sid + "/" + tc.removed); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s: the removed machine %s is still there: %v", tc.name, tc.removed, err)
			}
		}
	}

	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
	f.jobOK("destroy", ref, err)
	if entries, _ := os.ReadDir(f.dir + "/" + sid); len(entries) != 0 {
		t.Fatalf("machines left after destroy: %v", entries)
	}
}
