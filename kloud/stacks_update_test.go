package kloud_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/userdata"
)

// updateRev is a template of dummy machines: "keep" never changes; "chg" gets a new trigger in
// later revisions (Terraform replaces it); "vm" has a count.
func updateRev(chgTrigger string, vmCount int, withChg bool) string {
	script := `
  input = <<-EOT
    #!/bin/bash
    echo "user script of $KLOUD_OWNER"
  EOT
`
	out := `resource "terraform_data" "keep" {` + script + "}\n"
	if withChg {
		out += `resource "terraform_data" "chg" {` + script + `  triggers_replace = "` + chgTrigger + `"` + "\n}\n"
	}
	if vmCount > 0 {
		out += `resource "terraform_data" "vm" {` + script + `  count = ` + strconv.Itoa(vmCount) + "\n}\n"
	}
	return out
}

func (f *flowEnv) updateTemplate(id, main string) {
	f.t.Helper()
	if _, err := f.client().TemplateUpdate(f.t.Context(), api.TemplateParams{TemplateID: id, Files: map[string]string{"main.tf": main}}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *flowEnv) jobOK(what string, ref api.JobRef, err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatalf("%s: %v", what, err)
	}
	if last := f.follow(ref.JobID); last.Status != "succeeded" {
		f.t.Fatalf("%s: %+v", what, last)
	}
}

func (f *flowEnv) supervisorPID(sid, label string) string {
	b, _ := os.ReadFile(filepath.Join(f.dir, sid, label, userdata.SupervisorPIDPath))
	return strings.TrimSpace(string(b))
}

// TestStackUpdate: a built stack updated to a revision that adds a machine and replaces one
// keeps the unchanged machine as it was (record, kite id, agent process, files); the replaced
// one gets a new agent, the old key revoked; stack.plan shows it all first; scale adds and
// removes machines of a counted resource; a revision without a machine removes it.
func TestStackUpdate(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	c := f.client()
	ctx := t.Context()
	tid := f.template(updateRev("1", 0, true))
	sid, _ := f.stack(tid)

	if _, err := c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid}); !errors.Is(err, kite.ErrState) {
		t.Fatalf("update of a stack never built: %v", err)
	}
	ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid})
	f.jobOK("build", ref, err)
	before := f.machines(sid)
	keep, chg := before["keep"], before["chg"]
	disk := filepath.Join(f.dir, sid, "keep", "disk.txt")
	if err := os.WriteFile(disk, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	keepPID := f.supervisorPID(sid, "keep")
	if keepPID == "" {
		t.Fatal("no klient supervisor pid for keep")
	}

	f.updateTemplate(tid, updateRev("2", 1, true))
	view, err := c.StackDescribe(ctx, api.StackRef{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	if view.TemplateRev != 1 || view.LatestRev != 2 || !view.UpdateAvailable {
		t.Fatalf("describe before update: rev %d latest %d available %v", view.TemplateRev, view.LatestRev, view.UpdateAvailable)
	}
	list, err := c.StackList(ctx, api.StackListParams{})
	if err != nil || len(list.Stacks) != 1 || !list.Stacks[0].UpdateAvailable {
		t.Fatalf("list: %+v %v", list, err)
	}

	plan, err := c.StackPlan(ctx, api.StackPlanParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Update == nil || plan.Rev != 2 || plan.Update.FromRev != 1 {
		t.Fatalf("plan: %+v", plan)
	}
	actions := map[string]api.MachineChange{}
	for _, mc := range plan.Update.Machines {
		actions[mc.Label] = mc
	}
	if actions["keep"].Action != api.UpdateKeep || actions["chg"].Action != api.UpdateReplace || actions["vm.0"].Action != api.UpdateAdd || len(actions) != 3 {
		t.Fatalf("plan actions: %+v", plan.Update.Machines)
	}
	if ch := actions["chg"].Changes; len(ch) == 0 || ch[0].Name != "triggers_replace" || ch[0].After != "2" {
		t.Fatalf("chg's changes: %+v", ch)
	}
	if strings.Contains(mustJSON(t, plan), "eyJ") {
		t.Fatal("the plan shows an agent key")
	}
	// The plan changed nothing: not the records, not terraformer's stored files of the stack
	// (a destroy runs them).
	if after := f.machines(sid); len(after) != 2 || after["keep"].KiteID != keep.KiteID || after["chg"].KiteID != chg.KiteID {
		t.Fatalf("machines after a plan: %+v", after)
	}
	if stored := f.storedFiles(sid); strings.Contains(stored, "eyJhbGciOiJub25lIn0") || strings.Contains(stored, `"2"`) || !strings.Contains(stored, `triggers_replace = "1"`) {
		t.Fatalf("terraformer's stored files of the stack after a plan:\n%s", stored)
	}

	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
	f.jobOK("update to rev 2", ref, err)
	after := f.machines(sid)
	if len(after) != 3 {
		t.Fatalf("after update: %d machines", len(after))
	}
	k := after["keep"]
	if k.ID != keep.ID || k.KiteID != keep.KiteID || k.State != provider.Running || k.Agent.Status != model.AgentConnected {
		t.Fatalf("keep changed: before %+v\nafter %+v", keep, k)
	}
	if b, err := os.ReadFile(disk); err != nil || string(b) != "mine" {
		t.Fatalf("keep's file: %q %v", b, err)
	}
	if pid := f.supervisorPID(sid, "keep"); pid != keepPID {
		t.Fatalf("keep's agent was restarted: pid %s, was %s", pid, keepPID)
	}
	cg := after["chg"]
	if cg.ID != chg.ID || cg.KiteID == chg.KiteID || cg.State != provider.Running || cg.Agent.Status != model.AgentConnected {
		t.Fatalf("chg after replace: before %+v\nafter %+v", chg, cg)
	}
	if vm := after["vm.0"]; vm.State != provider.Running || vm.Agent.Status != model.AgentConnected {
		t.Fatalf("vm.0: %+v", vm)
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		return len(f.Server.Kontrol.Lookup(kite.Identity{ID: chg.KiteID})) == 0
	}, "the replaced machine's old agent is still registered")
	view, _ = c.StackDescribe(ctx, api.StackRef{StackID: sid})
	if view.TemplateRev != 2 || view.UpdateAvailable || view.State != model.StackInitialized || len(view.Machines) != 3 || view.Diverged {
		t.Fatalf("describe after update: %+v", view.Stack)
	}

	// Scale: literal counts only; then 1 → 3 → 1.
	if _, err := c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "keep", Count: 2}); !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "count = 1") {
		t.Fatalf("scale of a resource without count: %v", err)
	}
	if _, err := c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "nope", Count: 2}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("scale of an unknown resource: %v", err)
	}
	ref, err = c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "vm", Count: 3})
	f.jobOK("scale to 3", ref, err)
	if got := f.machines(sid); len(got) != 5 || got["vm.2"].State != provider.Running || got["keep"].KiteID != keep.KiteID {
		t.Fatalf("after scale to 3: %+v", got)
	}
	ref, err = c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "vm", Count: 1})
	f.jobOK("scale to 1", ref, err)
	got := f.machines(sid)
	if len(got) != 3 || got["vm.0"].State != provider.Running {
		t.Fatalf("after scale to 1: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(f.dir, sid, "vm.2")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("vm.2's directory after scaling down: %v", err)
	}
	view, _ = c.StackDescribe(ctx, api.StackRef{StackID: sid})
	if !view.Diverged || view.TemplateRev != 2 || len(view.Machines) != 3 {
		t.Fatalf("describe after scale: %+v", view.Stack)
	}

	// A revision without chg removes it.
	f.updateTemplate(tid, updateRev("2", 1, false))
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
	f.jobOK("update to rev 3", ref, err)
	got = f.machines(sid)
	if _, has := got["chg"]; has || len(got) != 2 || got["keep"].KiteID != keep.KiteID {
		t.Fatalf("after removing chg: %+v", got)
	}
	if pid := f.supervisorPID(sid, "keep"); pid != keepPID {
		t.Fatalf("keep's agent was restarted: pid %s, was %s", pid, keepPID)
	}

	// A revision Terraform refuses is refused at the call and changes nothing.
	f.updateTemplate(tid, updateRev("2", 1, false)+"resource \"terraform_data\" \"broken\" {\n  count = -1\n  input = \"x\"\n}\n")
	if _, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("update to a broken revision: %v", err)
	}
	view, _ = c.StackDescribe(ctx, api.StackRef{StackID: sid})
	if view.State != model.StackInitialized || view.TemplateRev != 3 || len(view.Machines) != 2 {
		t.Fatalf("stack after an update to a broken revision: %s (%s), rev %d, %d machines", view.State, view.Reason, view.TemplateRev, len(view.Machines))
	}

	// Cancelled at once, an update leaves a stack that can be updated again.
	f.updateTemplate(tid, updateRev("2", 2, false))
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.JobCancel(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(ref.JobID); last.Status != "cancelled" && last.Status != "failed" {
		t.Fatalf("cancelled update: %+v", last)
	}
	view, _ = c.StackDescribe(ctx, api.StackRef{StackID: sid})
	if view.State != model.StackInitialized && view.State != model.StackFailed {
		t.Fatalf("stack after a cancelled update: %s (%s)", view.State, view.Reason)
	}
	for _, m := range view.MachineDocs {
		if m.State.InProgress() {
			t.Fatalf("machine %s after a cancelled update: %s", m.Label, m.State)
		}
	}
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
	f.jobOK("update after a cancelled one", ref, err)
	if got := f.machines(sid); len(got) != 3 || got["vm.1"].State != provider.Running || got["keep"].KiteID != keep.KiteID {
		t.Fatalf("after the update that followed a cancelled one: %+v", got)
	}

	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
	f.jobOK("destroy", ref, err)
}

// storedFiles is the content of terraformer's stored files of the stack (what a destroy runs).
func (f *flowEnv) storedFiles(sid string) string {
	f.t.Helper()
	work := filepath.Join(f.tfDir, "stacks", "stack-"+sid, "work")
	names, err := filepath.Glob(filepath.Join(work, "*.tf*"))
	if err != nil || len(names) == 0 {
		f.t.Fatalf("terraformer's files of stack %s: %v %v", sid, names, err)
	}
	var out strings.Builder
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			f.t.Fatal(err)
		}
		out.WriteString("# " + filepath.Base(n) + "\n" + string(b))
	}
	return out.String()
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
