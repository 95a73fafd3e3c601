package local

import (
	"context"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// The firewall (provider.Firewaller): the sandbox's nftables rules on the bridge
// (sandbox/firewall.go). With no rules a machine is reached by the kloud host and its owner's
// machines (tag kloud_owner, else the stack's); rules open a port to the team, a CIDR or any
// machine.

func toSandbox(rules []provider.PortRule) []sandbox.FirewallRule {
	out := make([]sandbox.FirewallRule, len(rules))
	for i, r := range rules {
		out[i] = sandbox.FirewallRule{Port: r.Port, Protocol: r.Protocol, From: r.From}
	}
	return out
}

func fromSandbox(rules []sandbox.FirewallRule) []provider.PortRule {
	out := make([]provider.PortRule, len(rules))
	for i, r := range rules {
		out[i] = provider.PortRule{Port: r.Port, Protocol: r.Protocol, From: r.From}
	}
	return out
}

// OpenPorts implements provider.Firewaller.
func (m *machine) OpenPorts(ctx context.Context, rules []provider.PortRule) ([]provider.PortRule, error) {
	out, err := m.m.OpenPorts(ctx, m.id, toSandbox(rules))
	if err != nil {
		return nil, m.wrap("open ports of", err)
	}
	return fromSandbox(out), nil
}

// ClosePorts implements provider.Firewaller.
func (m *machine) ClosePorts(ctx context.Context, rules []provider.PortRule) ([]provider.PortRule, error) {
	out, err := m.m.ClosePorts(ctx, m.id, toSandbox(rules))
	if err != nil {
		return nil, m.wrap("close ports of", err)
	}
	return fromSandbox(out), nil
}

// Ports implements provider.Firewaller.
func (m *machine) Ports(ctx context.Context) ([]provider.PortRule, error) {
	out, err := m.m.Firewall(ctx, m.id)
	if err != nil {
		return nil, m.wrap("list ports of", err)
	}
	return fromSandbox(out), nil
}
