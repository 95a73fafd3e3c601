package kloud

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// The firewall of a machine (Juju's instance firewall mode): machine.ports.open, close and
// list call the machine's provider (provider.Firewaller, capability "firewall"), which
// enforces the rules. kloud records the rules it was asked for on the machine (Machine.Ports,
// the desired state: open and close change the record, then the provider, and put the record
// back when the provider fails), so that a machine an update replaces gets them again
// (keepPorts, after a build or an update settles); list shows the provider's rules. Who: list,
// whoever may see the machine; open and close, its owner, team admins and a full share (what
// may start and stop it). A close names rules by port, and by protocol and source when given:
// it closes every rule that matches, and refuses (closing nothing) a pattern that matches no
// rule, saying which are open.

// portAPI serves machine.ports.list, machine.ports.open and machine.ports.close, and re-applies
// the recorded rules after a build or an update (Server.keepPorts). New builds it once
// (Server.ports).
type portAPI struct {
	store *store.Store // Persist, and its machines
	log   *slog.Logger
	k     portKloud
}

// portKloud is what portAPI uses of kloud's Server: its machines (machines.go) and the build
// flow (a stack's machines).
type portKloud interface {
	machineLoader
	flow() *stackbuild.Flow
}

// list serves machine.ports.list.
func (a *portAPI) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineRef) (api.PortsResult, error) {
	fw, m, err := a.firewaller(ctx, c, p.MachineID, api.MethodMachinePortsList, false)
	if err != nil {
		return api.PortsResult{}, err
	}
	rules, err := fw.Ports(ctx)
	if err != nil {
		return api.PortsResult{}, fmt.Errorf("%s: %w", api.MethodMachinePortsList, err)
	}
	return api.PortsResult{MachineID: m.ID, Rules: nonNil(rules)}, nil
}

// change serves machine.ports.open (open) or machine.ports.close.
func (a *portAPI) change(open bool) func(ctx context.Context, c *Caller, _ *kite.Request, p *api.PortsParams) (api.PortsResult, error) {
	method := api.MethodMachinePortsClose
	if open {
		method = api.MethodMachinePortsOpen
	}
	return func(ctx context.Context, c *Caller, _ *kite.Request, p *api.PortsParams) (api.PortsResult, error) {
		fw, m, err := a.firewaller(ctx, c, p.MachineID, method, true)
		if err != nil {
			return api.PortsResult{}, err
		}
		if open {
			for i := range p.Rules {
				if err := p.Rules[i].Normalize(); err != nil { // tcp and any where omitted
					return api.PortsResult{}, fmt.Errorf("rules[%d]: %s: %w", i, err.Error(), kite.ErrInvalidParams)
				}
			}
		} else if p.Rules, err = rulesToClose(ctx, fw, m, p.Rules); err != nil {
			return api.PortsResult{}, err
		}
		// The record first (what kloud re-applies), then the provider; on an error the record
		// is put back: what this call added is removed, what it removed is added.
		changed := portsChanged(m.Ports, p.Rules, open)
		if open && len(m.Ports)+len(changed) > maxPorts {
			return api.PortsResult{}, fmt.Errorf("machine %s would have %d rules, at most %d: close some first: %w", m.Label, len(m.Ports)+len(changed), maxPorts, kite.ErrInvalidParams)
		}
		if len(changed) > 0 {
			if err := a.record(ctx, m.ID, changed, open); err != nil {
				return api.PortsResult{}, fmt.Errorf("%s: record the rules: %w", method, err)
			}
		}
		var rules []provider.PortRule
		if open {
			rules, err = fw.OpenPorts(ctx, p.Rules)
		} else {
			rules, err = fw.ClosePorts(ctx, p.Rules)
		}
		if err != nil {
			if len(changed) > 0 {
				if perr := a.record(context.WithoutCancel(ctx), m.ID, changed, !open); perr != nil {
					a.log.ErrorContext(ctx, "put back the recorded ports after the provider failed", "machine", m.ID, "err", perr)
				}
			}
			return api.PortsResult{}, fmt.Errorf("%s: %w", method, err)
		}
		a.log.InfoContext(ctx, "machine ports changed", "machine", m.ID, "by", c.Username, "open", open, "rules", fmt.Sprint(p.Rules))
		return api.PortsResult{MachineID: m.ID, Rules: nonNil(rules)}, nil
	}
}

// rulesToClose is what a close of patterns closes: every rule of the machine (as its provider
// has them, and as kloud recorded them) that a pattern matches (its port; its protocol and its
// source unless omitted). A pattern that matches none is refused (-32003, data.type
// api.PortsNotOpenType) with the rules that are open, and nothing is closed.
func rulesToClose(ctx context.Context, fw provider.Firewaller, m *model.Machine, patterns []provider.PortRule) ([]provider.PortRule, error) {
	have, err := fw.Ports(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: list the provider's rules: %w", api.MethodMachinePortsClose, err)
	}
	open := slices.Clone(have)
	for _, r := range m.Ports {
		if !slices.Contains(open, r) {
			open = append(open, r)
		}
	}
	var rules, notOpen []provider.PortRule
	for _, pat := range patterns {
		found := false
		for _, r := range open {
			if r.Port == pat.Port && (pat.Protocol == "" || pat.Protocol == r.Protocol) && (pat.From == "" || pat.From == r.From) {
				found = true
				if !slices.Contains(rules, r) {
					rules = append(rules, r)
				}
			}
		}
		if !found && !slices.Contains(notOpen, pat) {
			notOpen = append(notOpen, pat)
		}
	}
	if len(notOpen) == 0 {
		return rules, nil
	}
	what := make([]string, len(notOpen))
	for i, pat := range notOpen {
		what[i] = patternString(pat)
	}
	openText := "none (kloud and the owner's machines only)"
	if len(open) > 0 {
		openText = rulesString(open)
	}
	return nil, &kite.Error{Code: kite.CodeNotFound,
		Message: fmt.Sprintf("machine %s has no rule %s to close (nothing closed); open: %s", m.Label, strings.Join(what, " or "), openText),
		Data:    &kite.ErrorData{Type: api.PortsNotOpenType, Details: api.PortsNotOpen{MachineID: m.ID, NotOpen: notOpen, Open: nonNil(open)}}}
}

// patternString is a close's pattern in words: "8000", "8000/udp", "8000/tcp from team".
func patternString(r provider.PortRule) string {
	out := strconv.Itoa(r.Port)
	if r.Protocol != "" {
		out += "/" + r.Protocol
	}
	if r.From != "" {
		out += " from " + r.From
	}
	return out
}

// firewaller loads the machine, checks the caller and the provider's capability, and returns
// the machine's provider.Firewaller.
func (a *portAPI) firewaller(ctx context.Context, c *Caller, id, method string, change bool) (provider.Firewaller, *model.Machine, error) {
	m, err := a.k.loadMachine(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	if change && m.Owner != c.Username && !c.TeamAdmin(m.Team) && !hasGrant(m, c.Username, model.GrantFull) {
		return nil, nil, fmt.Errorf("only the owner, a team admin or a full share may change the firewall of machine %s: %w", m.Label, kite.ErrPermission)
	}
	if err := a.k.capable(m.Provider, method, provider.CapFirewall); err != nil {
		return nil, nil, err
	}
	pm, err := a.k.providerMachine(ctx, c, m)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: machine %s: %w", method, m.Label, err)
	}
	fw, ok := pm.(provider.Firewaller)
	if !ok {
		return nil, nil, fmt.Errorf("%s: provider %s advertises a firewall its machines lack: %w", method, m.Provider, provider.ErrUnsupported)
	}
	return fw, m, nil
}

// maxPorts bounds the rules kloud records for one machine (the bridge firewall's own bound).
const maxPorts = 256

// portsChanged is what opening (or closing) rules changes in the recorded rules have: the
// rules not recorded yet (or the recorded ones), each once.
func portsChanged(have, rules []provider.PortRule, open bool) []provider.PortRule {
	var changed []provider.PortRule
	for _, r := range rules {
		if slices.Contains(have, r) != open && !slices.Contains(changed, r) {
			changed = append(changed, r)
		}
	}
	return changed
}

// record adds rules to machine id's recorded rules (or removes them), retried while the
// store is unreachable.
func (a *portAPI) record(ctx context.Context, id string, rules []provider.PortRule, add bool) error {
	return a.store.Persist(ctx, "record the ports of machine "+id, 0, func(ctx context.Context) error {
		if add {
			return a.store.Machines().AddPorts(ctx, id, rules)
		}
		return a.store.Machines().RemovePorts(ctx, id, rules)
	})
}

// keepPorts gives each machine of stack st whose rules kloud recorded the rules it lacks and
// takes away those it has beyond them (a machine a build or an update replaced comes back
// with none), after the build or update settled. What fails is logged on job j; the job goes
// on (the machines run, only a port is closed that should be open, and machine.ports.open
// applies it again). stacks_deps.go calls it; portAPI.keep does it.
func (s *Server) keepPorts(ctx context.Context, j stackbuild.Job, st *model.Stack) {
	s.ports.keep(ctx, j, st)
}

// keep is Server.keepPorts.
func (a *portAPI) keep(ctx context.Context, j stackbuild.Job, st *model.Stack) {
	ms, err := a.k.flow().StackMachines(ctx, st.ID)
	if err != nil {
		j.Logf(ctx, "firewall rules not checked: %v", err)
		return
	}
	for i := range ms {
		m := &ms[i]
		if len(m.Ports) == 0 || m.State == provider.Terminating || a.k.capable(m.Provider, api.MethodMachinePortsOpen, provider.CapFirewall) != nil {
			continue
		}
		opened, closed, err := a.match(ctx, m)
		if len(opened)+len(closed) > 0 {
			j.Logf(ctx, "%s: firewall rules re-applied: opened %s, closed %s", m.Label, rulesString(opened), rulesString(closed))
			a.log.InfoContext(ctx, "machine ports re-applied", "machine", m.ID, "stack", st.ID, "opened", rulesString(opened), "closed", rulesString(closed))
		}
		if err != nil {
			j.Logf(ctx, "%s: firewall rules not re-applied: %v (machine.ports.open applies them again)", m.Label, err)
			a.log.WarnContext(ctx, "re-apply machine ports", "machine", m.ID, "stack", st.ID, "err", err)
		}
	}
}

// match opens what of m's recorded rules its provider lacks and closes what it has beyond
// them, and returns what it opened and closed.
func (a *portAPI) match(ctx context.Context, m *model.Machine) (opened, closed []provider.PortRule, err error) {
	pm, err := a.k.providerMachine(ctx, nil, m)
	if err != nil {
		return nil, nil, err
	}
	fw, ok := pm.(provider.Firewaller)
	if !ok {
		return nil, nil, fmt.Errorf("provider %s advertises a firewall its machines lack: %w", m.Provider, provider.ErrUnsupported)
	}
	have, err := fw.Ports(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list the provider's rules: %w", err)
	}
	missing := slices.DeleteFunc(slices.Clone(m.Ports), func(r provider.PortRule) bool { return slices.Contains(have, r) })
	extra := slices.DeleteFunc(slices.Clone(have), func(r provider.PortRule) bool { return slices.Contains(m.Ports, r) })
	if len(missing) > 0 {
		if _, err := fw.OpenPorts(ctx, missing); err != nil {
			return nil, nil, fmt.Errorf("open %s: %w", rulesString(missing), err)
		}
		opened = missing
	}
	if len(extra) > 0 {
		if _, err := fw.ClosePorts(ctx, extra); err != nil {
			return opened, nil, fmt.Errorf("close %s: %w", rulesString(extra), err)
		}
		closed = extra
	}
	return opened, closed, nil
}

func rulesString(rs []provider.PortRule) string {
	if len(rs) == 0 {
		return "none"
	}
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("%d/%s from %s", r.Port, r.Protocol, r.From)
	}
	return strings.Join(out, ", ")
}

func nonNil(r []provider.PortRule) []provider.PortRule {
	if r == nil {
		return []provider.PortRule{}
	}
	return r
}
