package providertest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// Update: stack.update of the built stack to Template(1) keeps its first machine (same id and
// kite id, agent connected, a file written before still there) and removes the second: the
// provider's ApplyTemplate renders a machine whose agent configuration did not change into the
// same user data, so Terraform leaves it alone, and configures Terraform so that it can destroy
// the machine the revision dropped (Destroy's leftover check then sees that nothing of it is
// left). Adding machines is a build's work, which Stack tests. Every provider must pass: kloud
// offers stack.update for every stack.
func (s *suite) testUpdate(t *testing.T) {
	s.needStack(t)
	ctx := t.Context()
	before := s.list(t)
	m := s.machines[0]
	b := make([]byte, 8)
	rand.Read(b)
	const path = "kloud-update.txt"
	data := "kept across the update " + hex.EncodeToString(b)
	s.c.WriteFile(t, m, path, data)

	view, err := s.cl.StackDescribe(ctx, api.StackRef{StackID: s.stackID})
	if err != nil {
		t.Fatalf("stack.describe: %v", err)
	}
	update := func(n int) {
		t.Helper()
		if _, err := s.cl.TemplateUpdate(ctx, api.TemplateParams{TemplateID: view.TemplateID, Files: s.templateOf(n)}); err != nil {
			t.Fatalf("template.update to Template(%d): %v", n, err)
		}
		plan, err := s.cl.StackPlan(ctx, api.StackPlanParams{StackID: s.stackID})
		if err != nil {
			t.Fatalf("stack.plan of the stack: %v", err)
		}
		gone := s.machines[1].Label
		for _, mc := range plan.Update.Machines {
			switch {
			case mc.Label == gone && mc.Action != api.UpdateRemove:
				t.Errorf("update to Template(%d) would %s machine %s, want remove", n, mc.Action, mc.Label)
			case mc.Label != gone && mc.Action != api.UpdateKeep && mc.Action != api.UpdateChange:
				t.Errorf("update to Template(%d) would %s machine %s (%+v): a machine whose template did not change must be kept", n, mc.Action, mc.Label, mc.Changes)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		ref, err := s.cl.StackUpdate(ctx, api.StackUpdateParams{StackID: s.stackID})
		if err != nil {
			t.Fatalf("stack.update: %v", err)
		}
		s.job(t, "update the stack to Template(1)", ref.JobID)
		ms := s.list(t)
		if len(ms) != n {
			t.Fatalf("after the update to Template(%d): %d machines", n, len(ms))
		}
		for l, got := range ms {
			if _, had := before[l]; !had {
				t.Errorf("machine %s appeared in the update to Template(%d)", l, n)
			}
			if got.State != provider.Running || got.Agent.Status != model.AgentConnected {
				t.Errorf("machine %s after the update: %s (%s), agent %s", l, got.State, got.Reason, got.Agent.Status)
			}
			if old, had := before[l]; had && (old.ID != got.ID || old.KiteID != got.KiteID) {
				t.Errorf("machine %s was not kept: id %s → %s, kite %s → %s", l, old.ID, got.ID, old.KiteID, got.KiteID)
			}
		}
	}
	update(1)
	if _, has := s.list(t)[s.machines[1].Label]; has {
		t.Errorf("machine %s is still listed after the update to Template(1)", s.machines[1].Label)
	}
	s.machines = s.machines[:1]
	if got := s.c.ReadFile(t, m, path); got != data {
		t.Errorf("after the update, %s of %s holds %q, want %q", path, m.Label, got, data)
	}
}
