package kloud_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
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
	t.Parallel()
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
	if err := w.e.Server.Store().Machines().InsertMany(ctx, []model.Machine{
		{ID: "m1", StackID: "s1", Label: "web", Provider: "fw", Owner: "alice", Team: model.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now,
			Shares: []model.Share{{Username: "bob", Grant: model.GrantReadonly}, {Username: "dave", Grant: model.GrantFull}}},
		{ID: "m2", StackID: "s2", Label: "old", Provider: "nofw", Owner: "alice", Team: model.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now},
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
	t.Parallel()
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
	if err := w.e.Server.Store().Machines().InsertMany(ctx, []model.Machine{
		{ID: "m1", StackID: "s1", Label: "web", Provider: "fw", Owner: "alice", Team: model.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now},
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
	if _, err := alice.MachinePortsClose(ctx, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 8000}, {Port: 9}}}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("close of 8000 and 9 (never open): %v, want not found", err)
	}
	if got := recorded(); !slices.Equal(got, []provider.PortRule{web, dns}) {
		t.Errorf("recorded after a refused close of 8000 and 9 (never open): %+v, want both kept", got)
	}
	if _, err := alice.MachinePortsClose(ctx, api.PortsParams{MachineID: "m1", Rules: []api.PortRule{{Port: 8000}}}); err != nil {
		t.Fatal(err)
	}
	if got := recorded(); !slices.Equal(got, []provider.PortRule{dns}) {
		t.Errorf("recorded after closing 8000: %+v", got)
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

// TestMachinePortsClose: machine.ports.close closes what the user means: a rule without from
// (or protocol) closes every rule of its port (of its protocol); with from only that rule. A
// rule that matches nothing open is refused with not found (-32003, data.type portsNotOpen)
// listing what is open, and nothing is closed, of the provider's rules or kloud's record. A
// rule kloud recorded that the provider lost is closed too (the record follows).
func TestMachinePortsClose(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var rules []provider.PortRule
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "fw", ResourceType: "fw_machine",
		Machine: func(*provider.BaseMachine) (provider.Machine, error) {
			return rulesMachine{mu: &mu, rules: &rules}, nil
		}})
	w := newUserWorld(t, kloudtest.Options{Providers: reg})
	w.addUser("alice", "", false)
	ctx := t.Context()
	now := time.Now()
	if err := w.e.Server.Store().Machines().InsertMany(ctx, []model.Machine{
		{ID: "m1", StackID: "s1", Label: "dev.0", Provider: "fw", Owner: "alice", Team: model.DefaultTeam, State: provider.Running, CreatedAt: now, UpdatedAt: now},
	}); err != nil {
		t.Fatal(err)
	}
	alice := api.NewClient(w.as("alice"))
	state := func() (have, recorded []provider.PortRule) {
		t.Helper()
		m, err := w.e.Server.Store().Machines().Get(ctx, "m1")
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(rules), m.Ports
	}
	same := func(a, b []provider.PortRule) bool {
		return len(a) == len(b) && !slices.ContainsFunc(a, func(r provider.PortRule) bool { return !slices.Contains(b, r) })
	}
	want := func(what string, rs ...provider.PortRule) {
		t.Helper()
		have, recorded := state()
		if !same(have, rs) || !same(recorded, rs) {
			t.Fatalf("%s: the provider has %v, kloud recorded %v, want %v", what, have, recorded, rs)
		}
	}
	open := func(rs ...api.PortRule) {
		t.Helper()
		if _, err := alice.MachinePortsOpen(ctx, api.PortsParams{MachineID: "m1", Rules: rs}); err != nil {
			t.Fatal(err)
		}
	}
	closeRules := func(rs ...api.PortRule) (api.PortsResult, error) {
		return alice.MachinePortsClose(ctx, api.PortsParams{MachineID: "m1", Rules: rs})
	}
	refused := func(what string, err error, notOpen []api.PortRule, msg ...string) {
		t.Helper()
		var ke *kite.Error
		if !errors.As(err, &ke) || ke.Code != kite.CodeNotFound || ke.Type() != api.PortsNotOpenType {
			t.Fatalf("%s: %#v, want -32003 of type %s", what, err, api.PortsNotOpenType)
		}
		for _, m := range msg {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: %q does not say %q", what, err, m)
			}
		}
		b, _ := json.Marshal(ke.Data.Details)
		var d api.PortsNotOpen
		if err := json.Unmarshal(b, &d); err != nil || d.MachineID != "m1" || !slices.Equal(d.NotOpen, notOpen) {
			t.Errorf("%s: details %s, want notOpen %v", what, b, notOpen)
		}
		have, _ := state()
		if !same(d.Open, have) {
			t.Errorf("%s: details say open %v, the provider has %v", what, d.Open, have)
		}
	}
	team := provider.PortRule{Port: 8000, Protocol: "tcp", From: "team"}
	anyTCP := provider.PortRule{Port: 8000, Protocol: "tcp", From: "any"}
	anyUDP := provider.PortRule{Port: 8000, Protocol: "udp", From: "any"}
	other := provider.PortRule{Port: 9000, Protocol: "tcp", From: "10.200.0.7/32"}

	// Nothing open: a close says so.
	_, err := closeRules(api.PortRule{Port: 8000})
	refused("close 8000 with nothing open", err, []api.PortRule{{Port: 8000}}, "machine dev.0 has no rule 8000 to close", "open: none")

	// Opened from team, closed by port: closed.
	open(api.PortRule{Port: 8000, From: "team"})
	want("opened 8000 from team", team)
	res, err := closeRules(api.PortRule{Port: 8000})
	if err != nil || len(res.Rules) != 0 {
		t.Fatalf("close 8000 after opening it from team: %+v %v", res, err)
	}
	want("closed 8000")

	// From any when only team is open: refused, listing what is; then from team closes it.
	open(api.PortRule{Port: 8000, From: "team"}, api.PortRule{Port: 9000, From: "10.200.0.7"})
	_, err = closeRules(api.PortRule{Port: 8000, From: "any"})
	refused("close 8000 from any with only team open", err, []api.PortRule{{Port: 8000, From: "any"}},
		"has no rule 8000 from any to close (nothing closed); open: ", "8000/tcp from team", "9000/tcp from 10.200.0.7/32")
	want("after the refused close", team, other)
	if _, err := closeRules(api.PortRule{Port: 8000, Protocol: "TCP", From: "team"}); err != nil {
		t.Fatal(err)
	}
	want("closed 8000/tcp from team", other)

	// A protocol narrows a close by port; a source given as an address matches its /32.
	open(api.PortRule{Port: 8000, From: "team"}, api.PortRule{Port: 8000}, api.PortRule{Port: 8000, Protocol: "udp"})
	if _, err := closeRules(api.PortRule{Port: 8000, Protocol: "tcp"}); err != nil {
		t.Fatal(err)
	}
	want("closed 8000/tcp", anyUDP, other)
	if _, err := closeRules(api.PortRule{Port: 9000, From: "10.200.0.7"}); err != nil {
		t.Fatal(err)
	}
	want("closed 9000 from 10.200.0.7", anyUDP)

	// One rule of a close that matches nothing: nothing is closed.
	open(api.PortRule{Port: 8000})
	_, err = closeRules(api.PortRule{Port: 8000}, api.PortRule{Port: 1234}, api.PortRule{Port: 53, Protocol: "udp"})
	refused("close 8000, 1234 and 53/udp", err, []api.PortRule{{Port: 1234}, {Port: 53, Protocol: "udp"}}, "has no rule 1234 or 53/udp to close")
	want("after the refused close of 8000 and 1234", anyTCP, anyUDP)

	// The provider lost a rule kloud recorded: closing it follows the record.
	mu.Lock()
	rules = slices.DeleteFunc(rules, func(r provider.PortRule) bool { return r == anyUDP })
	mu.Unlock()
	if _, err := closeRules(api.PortRule{Port: 8000}); err != nil {
		t.Fatal(err)
	}
	want("closed 8000 (udp only recorded)")
}
