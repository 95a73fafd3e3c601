package kloud_test

import (
	"context"
	"errors"
	"fmt"
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
	fail  *bool // if set and true, OpenPorts and ClosePorts fail (and change nothing)
}

var errFirewallDown = errors.New("the firewall is down")

func (m rulesMachine) OpenPorts(_ context.Context, rs []provider.PortRule) ([]provider.PortRule, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil && *m.fail {
		return nil, errFirewallDown
	}
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
	if m.fail != nil && *m.fail {
		return nil, errFirewallDown
	}
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

// TestMachinePortsRecorded: machine.ports.open/close record the rules on the machine (what
// kloud re-applies when an update replaces it), and a provider that fails leaves the record as
// it was: an open whose provider call fails records nothing, a close that fails removes
// nothing, and a rule recorded before is not taken away by a failed open of it.
func TestMachinePortsRecorded(t *testing.T) {
	var mu sync.Mutex
	var rules []provider.PortRule
	fail := false
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "fw", ResourceType: "fw_machine",
		Machine: func(*provider.BaseMachine) (provider.Machine, error) {
			return rulesMachine{mu: &mu, rules: &rules, fail: &fail}, nil
		}})
	w := newUserWorld(t, kloudtest.Options{Providers: reg})
	w.addUser("alice", "", false)
	ctx := t.Context()
	now := time.Now()
	if err := w.e.Server.Store().Machines().InsertMany(ctx, []kloud.Machine{
		{ID: "m1", StackID: "s1", Label: "web", Provider: "fw", Owner: "alice", Team: kloud.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now},
	}); err != nil {
		t.Fatal(err)
	}
	recorded := func() []provider.PortRule {
		t.Helper()
		m, err := w.e.Server.Store().Machines().Get(ctx, "m1")
		if err != nil {
			t.Fatal(err)
		}
		return m.Ports
	}
	setFail := func(v bool) {
		mu.Lock()
		fail = v
		mu.Unlock()
	}
	alice := api.NewClient(w.as("alice"))
	web := provider.PortRule{Port: 8000, Protocol: "tcp", From: "any"}
	dns := provider.PortRule{Port: 53, Protocol: "udp", From: "team"}
	if _, err := alice.MachinePortsOpen(ctx, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 8000}, {Port: 8000}}}); err != nil {
		t.Fatal(err)
	}
	if got := recorded(); !slices.Equal(got, []provider.PortRule{web}) {
		t.Fatalf("recorded after opening 8000 twice in one call: %+v", got)
	}

	setFail(true)
	_, err := alice.MachinePortsOpen(ctx, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 8000}, {Port: 53, Protocol: "udp", From: "team"}}})
	if err == nil || !strings.Contains(err.Error(), errFirewallDown.Error()) {
		t.Fatalf("open with the provider failing: %v", err)
	}
	if got := recorded(); !slices.Equal(got, []provider.PortRule{web}) {
		t.Errorf("recorded after a failed open of 8000 (recorded) and 53: %+v, want only 8000", got)
	}
	if _, err := alice.MachinePortsClose(ctx, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 8000}}}); err == nil {
		t.Fatal("close with the provider failing succeeded")
	}
	if got := recorded(); !slices.Equal(got, []provider.PortRule{web}) {
		t.Errorf("recorded after a failed close of 8000: %+v, want it kept", got)
	}

	setFail(false)
	if _, err := alice.MachinePortsOpen(ctx, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 53, Protocol: "UDP", From: "team"}}}); err != nil {
		t.Fatal(err)
	}
	if got := recorded(); !slices.Equal(got, []provider.PortRule{web, dns}) {
		t.Errorf("recorded after opening 53/udp: %+v", got)
	}
	if _, err := alice.MachinePortsClose(ctx, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 8000}, {Port: 9}}}); err != nil {
		t.Fatal(err)
	}
	if got := recorded(); !slices.Equal(got, []provider.PortRule{dns}) {
		t.Errorf("recorded after closing 8000 and 9 (never open): %+v", got)
	}
	mu.Lock()
	have := slices.Clone(rules)
	mu.Unlock()
	if !slices.Equal(have, []provider.PortRule{dns}) {
		t.Errorf("the provider has %+v, the record %+v", have, recorded())
	}

	// At most 256 rules are recorded: 4 calls of 64 CIDRs fill it up with 53/udp, the next is
	// refused before the provider or the record change.
	for call := range 5 {
		var rs []api.PortRule
		for i := range 64 {
			rs = append(rs, api.PortRule{Port: 22, From: fmt.Sprintf("10.%d.%d.0/24", call, i)})
		}
		_, err := alice.MachinePortsOpen(ctx, api.PortsParams{MachineID: "m1", Rules: rs})
		switch {
		case call < 3 && err != nil:
			t.Fatalf("open of 64 more rules (call %d): %v", call, err)
		case call >= 3:
			var ke *kite.Error
			if !errors.As(err, &ke) || ke.Code != kite.CodeInvalidParams || !strings.Contains(err.Error(), "close some first") {
				t.Fatalf("open beyond 256 rules (call %d): %v, want -32602 telling to close some", call, err)
			}
		}
	}
	if got := len(recorded()); got != 1+3*64 {
		t.Errorf("recorded %d rules, want %d", got, 1+3*64)
	}
}
