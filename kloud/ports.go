package kloud

import (
	"context"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
)

// The firewall of a machine (Juju's instance firewall mode): machine.ports.open, close and
// list call the machine's provider (provider.Firewaller, capability "firewall"), which keeps
// the rules and enforces them; kloud keeps nothing of its own, so the provider's view is the
// truth. Who: list, whoever may see the machine; open and close, its owner, team admins and a
// full share (what may start and stop it).

func (s *Server) machinePortsList(ctx context.Context, c *Caller, _ *kite.Request, p *api.MachineRef) (any, error) {
	fw, m, err := s.firewaller(ctx, c, p.MachineID, api.MethodMachinePortsList, false)
	if err != nil {
		return nil, err
	}
	rules, err := fw.Ports(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", api.MethodMachinePortsList, err)
	}
	return api.PortsResult{MachineID: m.ID, Rules: nonNil(rules)}, nil
}

func (s *Server) machinePortsChange(open bool) func(ctx context.Context, c *Caller, _ *kite.Request, p *api.PortsParams) (any, error) {
	method := api.MethodMachinePortsClose
	if open {
		method = api.MethodMachinePortsOpen
	}
	return func(ctx context.Context, c *Caller, _ *kite.Request, p *api.PortsParams) (any, error) {
		fw, m, err := s.firewaller(ctx, c, p.MachineID, method, true)
		if err != nil {
			return nil, err
		}
		var rules []provider.PortRule
		if open {
			rules, err = fw.OpenPorts(ctx, p.Rules)
		} else {
			rules, err = fw.ClosePorts(ctx, p.Rules)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", method, err)
		}
		s.log.Info("machine ports changed", "machine", m.ID, "by", c.Username, "open", open, "rules", fmt.Sprint(p.Rules))
		return api.PortsResult{MachineID: m.ID, Rules: nonNil(rules)}, nil
	}
}

// firewaller loads the machine, checks the caller and the provider's capability, and returns
// the machine's provider.Firewaller.
func (s *Server) firewaller(ctx context.Context, c *Caller, id, method string, change bool) (provider.Firewaller, *Machine, error) {
	m, err := s.loadMachine(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	if change && m.Owner != c.Username && !c.TeamAdmin(m.Team) && !hasGrant(m, c.Username, GrantFull) {
		return nil, nil, fmt.Errorf("only the owner, a team admin or a full share may change the firewall of machine %s: %w", m.Label, kite.ErrPermission)
	}
	if err := s.capable(m.Provider, method, provider.CapFirewall); err != nil {
		return nil, nil, err
	}
	pm, err := s.providerMachine(ctx, c, m)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: machine %s: %w", method, m.Label, err)
	}
	fw, ok := pm.(provider.Firewaller)
	if !ok {
		return nil, nil, fmt.Errorf("%s: provider %s advertises a firewall its machines lack: %w", method, m.Provider, provider.ErrUnsupported)
	}
	return fw, m, nil
}

func nonNil(r []provider.PortRule) []provider.PortRule {
	if r == nil {
		return []provider.PortRule{}
	}
	return r
}
