package local

import (
	"context"

	"github.com/kloud-dev/kloud/provider"
)

// The firewall (provider.Firewaller): the sandbox's nftables rules on the bridge
// (sandbox/firewall.go, providers/bridgefw). With no rules a machine is reached by the kloud host
// and its owner's machines (tag kloud_owner, else the stack's); rules open a port to the team, a
// CIDR or any machine.

// OpenPorts implements provider.Firewaller.
func (m *machine) OpenPorts(ctx context.Context, rules []provider.PortRule) ([]provider.PortRule, error) {
	out, err := m.m.OpenPorts(ctx, m.id, rules)
	if err != nil {
		return nil, m.wrap("open ports of", err)
	}
	return out, nil
}

// ClosePorts implements provider.Firewaller.
func (m *machine) ClosePorts(ctx context.Context, rules []provider.PortRule) ([]provider.PortRule, error) {
	out, err := m.m.ClosePorts(ctx, m.id, rules)
	if err != nil {
		return nil, m.wrap("close ports of", err)
	}
	return out, nil
}

// Ports implements provider.Firewaller.
func (m *machine) Ports(ctx context.Context) ([]provider.PortRule, error) {
	out, err := m.m.Firewall(ctx, m.id)
	if err != nil {
		return nil, m.wrap("list ports of", err)
	}
	return out, nil
}
