package providertest

import (
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
)

// Firewall (capability "firewall"): machine.ports.open/close/list round-trip through the
// provider: rules come back normalized, opening twice changes nothing, closing what is not
// there is refused (not found) and changes nothing, bad rules are refused, and the list ends
// empty. That the rules are enforced is
// FirewallEnforced's (firewall_enforced.go).
func (s *suite) testFirewall(t *testing.T) {
	s.needStack(t)
	s.needCap(t, provider.CapFirewall)
	ctx := t.Context()
	m := s.machines[0]
	list := func() []api.PortRule {
		t.Helper()
		res, err := s.cl.MachinePortsList(ctx, api.MachineRef{MachineID: m.ID})
		if err != nil {
			t.Fatalf("machine.ports.list: %v", err)
		}
		return res.Rules
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("a new machine has rules: %+v", got)
	}
	open := []api.PortRule{{Port: 8000}, {Port: 5353, Protocol: "udp", From: "team"}, {Port: 9000, From: "10.200.0.9"}}
	want := []api.PortRule{{Port: 8000, Protocol: "tcp", From: "any"}, {Port: 5353, Protocol: "udp", From: "team"}, {Port: 9000, Protocol: "tcp", From: "10.200.0.9/32"}}
	for range 2 { // the second time changes nothing
		res, err := s.cl.MachinePortsOpen(ctx, api.PortsParams{MachineID: m.ID, Rules: open})
		if err != nil {
			t.Fatalf("machine.ports.open: %v", err)
		}
		if !sameRules(res.Rules, want) {
			t.Fatalf("machine.ports.open returned %+v, want %+v", res.Rules, want)
		}
	}
	if got := list(); !sameRules(got, want) {
		t.Fatalf("machine.ports.list: %+v, want %+v", got, want)
	}
	// Closing what is not open is refused and changes nothing; a port closes all its rules.
	_, err := s.cl.MachinePortsClose(ctx, api.PortsParams{MachineID: m.ID, Rules: []api.PortRule{{Port: 8000}, {Port: 1234}}})
	wantCode(t, "machine.ports.close of 8000 and 1234 (not open)", err, kite.ErrNotFound)
	if got := list(); !sameRules(got, want) {
		t.Fatalf("machine.ports.list after a refused close: %+v, want %+v", got, want)
	}
	res, err := s.cl.MachinePortsClose(ctx, api.PortsParams{MachineID: m.ID, Rules: []api.PortRule{{Port: 8000}}})
	if err != nil || !sameRules(res.Rules, want[1:]) {
		t.Fatalf("machine.ports.close: %+v %v, want %+v", res.Rules, err, want[1:])
	}
	_, err = s.cl.MachinePortsOpen(ctx, api.PortsParams{MachineID: m.ID, Rules: []api.PortRule{{Port: 70000}}})
	wantCode(t, "machine.ports.open of port 70000", err, kite.ErrInvalidParams)
	if _, err := s.cl.MachinePortsClose(ctx, api.PortsParams{MachineID: m.ID, Rules: want[1:]}); err != nil {
		t.Fatalf("machine.ports.close: %v", err)
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("rules left after closing all: %+v", got)
	}
}

func sameRules(a, b []api.PortRule) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(r api.PortRule) bool { return !slices.Contains(b, r) })
}
