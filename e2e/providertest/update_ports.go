package providertest

import (
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// UpdateKeepsPorts (capability "firewall", and Config.ReplaceTemplate): a machine a stack
// update replaces (a new container, a new sandbox: the provider's rules, keyed by what it made,
// go with the old one) has the rules opened on it before: kloud records them on the machine
// and re-applies them once the update settled. The rules are closed again at the end (Firewall
// starts from none).
func (s *suite) testUpdateKeepsPorts(t *testing.T) {
	s.needStack(t)
	s.needCap(t, provider.CapFirewall)
	if s.c.ReplaceTemplate == nil {
		t.Skip("Config.ReplaceTemplate is not set: no update that replaces a machine to test")
	}
	ctx := t.Context()
	m := s.machines[0]
	open := []api.PortRule{{Port: 8000}, {Port: 5353, Protocol: "udp", From: "team"}}
	want := []api.PortRule{{Port: 8000, Protocol: "tcp", From: "any"}, {Port: 5353, Protocol: "udp", From: "team"}}
	if res, err := s.cl.MachinePortsOpen(ctx, api.PortsParams{MachineID: m.ID, Rules: open}); err != nil || !sameRules(res.Rules, want) {
		t.Fatalf("machine.ports.open: %+v %v, want %+v", res.Rules, err, want)
	}
	view, err := s.cl.StackDescribe(ctx, api.StackRef{StackID: s.stackID})
	if err != nil {
		t.Fatalf("stack.describe: %v", err)
	}
	n := len(s.machines)
	if _, err := s.cl.TemplateUpdate(ctx, api.TemplateParams{TemplateID: view.TemplateID, Files: s.c.ReplaceTemplate(n)}); err != nil {
		t.Fatalf("template.update to ReplaceTemplate(%d): %v", n, err)
	}
	plan, err := s.cl.StackPlan(ctx, api.StackPlanParams{StackID: s.stackID})
	if err != nil {
		t.Fatalf("stack.plan of the stack: %v", err)
	}
	for _, mc := range plan.Update.Machines {
		if mc.Label == m.Label && mc.Action != api.UpdateReplace {
			t.Fatalf("the update to ReplaceTemplate(%d) would %s machine %s (%+v), want replace: ReplaceTemplate must change what the provider replaces a machine for", n, mc.Action, mc.Label, mc.Changes)
		}
	}
	ref, err := s.cl.StackUpdate(ctx, api.StackUpdateParams{StackID: s.stackID})
	if err != nil {
		t.Fatalf("stack.update: %v", err)
	}
	s.job(t, "update the stack to ReplaceTemplate", ref.JobID)
	got, ok := s.list(t)[m.Label]
	if !ok {
		t.Fatalf("machine %s is gone after the update that replaced it", m.Label)
	}
	if got.ID != m.ID || got.State != provider.Running || got.Agent.Status != model.AgentConnected {
		t.Fatalf("machine %s after its replacement: id %s (was %s), %s (%s), agent %s", m.Label, got.ID, m.ID, got.State, got.Reason, got.Agent.Status)
	}
	s.machines[0] = got
	res, err := s.cl.MachinePortsList(ctx, api.MachineRef{MachineID: m.ID})
	if err != nil {
		t.Fatalf("machine.ports.list: %v", err)
	}
	if !sameRules(res.Rules, want) {
		t.Errorf("machine %s replaced by the update has rules %+v, want %+v (opened before the update)", m.Label, res.Rules, want)
	}
	if _, err := s.cl.MachinePortsClose(ctx, api.PortsParams{MachineID: m.ID, Rules: want}); err != nil {
		t.Fatalf("machine.ports.close: %v", err)
	}
}
