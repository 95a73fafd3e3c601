package kloud_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/provider"
)

// rulesMachine keeps a machine's rules in memory: a provider's Firewaller, to test kloud's side
// (who may call, validation, the capability); the local provider's enforcement is tested in
// providers/local (sandbox firewall, conformance).
type rulesMachine struct {
	capMachine
	mu    *sync.Mutex
	rules *[]provider.PortRule
}

func (m rulesMachine) OpenPorts(_ context.Context, rs []provider.PortRule) ([]provider.PortRule, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rs {
		if !slices.Contains(*m.rules, r) {
			*m.rules = append(*m.rules, r)
		}
	}
	return slices.Clone(*m.rules), nil
}

func (m rulesMachine) ClosePorts(_ context.Context, rs []provider.PortRule) ([]provider.PortRule, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.rules = slices.DeleteFunc(*m.rules, func(r provider.PortRule) bool { return slices.Contains(rs, r) })
	return slices.Clone(*m.rules), nil
}

func (m rulesMachine) Ports(context.Context) ([]provider.PortRule, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(*m.rules), nil
}

// TestMachinePorts: machine.ports.* reach the provider's firewall for the owner (and a full
// share); a read-only share lists only; strangers see nothing; bad rules are -32602; a provider
// without the capability is -32005.
func TestMachinePorts(t *testing.T) {
	var mu sync.Mutex
	var rules []provider.PortRule
	reg := provider.NewRegistry()
	fw := &provider.Provider{Name: "fw", ResourceType: "fw_machine",
		Machine: func(*provider.BaseMachine) (provider.Machine, error) {
			return rulesMachine{mu: &mu, rules: &rules}, nil
		}}
	reg.Register(fw)
	reg.Register(&provider.Provider{Name: "nofw", ResourceType: "nofw_machine",
		Machine: func(*provider.BaseMachine) (provider.Machine, error) { return capMachine{}, nil }})
	if !fw.Can(provider.CapFirewall) {
		t.Fatalf("a provider whose machines implement Firewaller: caps %v", fw.Caps())
	}
	w := newUserWorld(t, kloudtest.Options{Providers: reg})
	for _, u := range []string{"alice", "bob", "carol", "dave"} {
		w.addUser(u, "", false)
	}
	ctx := t.Context()
	now := time.Now()
	if err := w.e.Server.Store().Machines().InsertMany(ctx, []kloud.Machine{
		{ID: "m1", StackID: "s1", Label: "web", Provider: "fw", Owner: "alice", Team: kloud.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now,
			Shares: []kloud.Share{{Username: "bob", Grant: kloud.GrantReadonly}, {Username: "dave", Grant: kloud.GrantFull}}},
		{ID: "m2", StackID: "s2", Label: "old", Provider: "nofw", Owner: "alice", Team: kloud.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now},
	}); err != nil {
		t.Fatal(err)
	}
	alice := api.NewClient(w.as("alice"))
	res, err := alice.MachinePortsOpen(ctx, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 8000}, {Port: 53, Protocol: "UDP", From: "10.200.0.7"}}})
	want := []api.PortRule{{Port: 8000, Protocol: "tcp", From: "any"}, {Port: 53, Protocol: "udp", From: "10.200.0.7/32"}}
	if err != nil || !slices.Equal(res.Rules, want) {
		t.Fatalf("open: %+v %v", res, err)
	}
	code := func(err error) int64 {
		var ke *kite.Error
		if errors.As(err, &ke) {
			return ke.Code
		}
		return 0
	}
	for _, c := range []struct {
		who    string
		method string
		params any
		want   int64
		msg    string
	}{
		{"bob", api.MethodMachinePortsOpen, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 22}}}, kite.CodePermission, "only the owner"},
		{"carol", api.MethodMachinePortsList, api.MachineRef{MachineID: "m1"}, kite.CodeNotFound, "m1"},
		{"alice", api.MethodMachinePortsOpen, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 0}}}, kite.CodeInvalidParams, "port 0"},
		{"alice", api.MethodMachinePortsOpen, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 1, From: "everyone"}}}, kite.CodeInvalidParams, "from"},
		{"alice", api.MethodMachinePortsOpen, api.PortsParams{MachineID: "m1"}, kite.CodeInvalidParams, "rules"},
		{"alice", api.MethodMachinePortsList, api.MachineRef{MachineID: "m2"}, kite.CodeState, "provider nofw does not support firewall"},
	} {
		err := w.call(c.who, c.method, c.params, nil)
		if code(err) != c.want || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s %s %+v: %v, want %d %q", c.who, c.method, c.params, err, c.want, c.msg)
		}
	}
	var listed api.PortsResult
	w.must("bob", api.MethodMachinePortsList, api.MachineRef{MachineID: "m1"}, &listed)
	if !slices.Equal(listed.Rules, want) {
		t.Errorf("bob lists: %+v", listed)
	}
	w.must("dave", api.MethodMachinePortsClose, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 8000}}}, &listed)
	if !slices.Equal(listed.Rules, want[1:]) {
		t.Errorf("after dave's close: %+v", listed)
	}
}
