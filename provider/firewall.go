package provider

import "context"

// Firewalls (Juju's "instance" firewall mode): ingress rules per machine. A provider whose
// machines implement Firewaller has CapFirewall; kloud's machine.ports.open/close/list call it
// (docs/providers.md "Firewall"). What a machine accepts with no rules is the provider's
// default, which must be: the kloud host (agent traffic) and the same owner's machines reach
// it; other users' machines do not.

// Firewaller is implemented by machines whose ingress the provider filters. Rules are
// normalized (PortRule.Normalize) before they are passed. OpenPorts of a rule that is there and
// ClosePorts of one that is not are no-ops; both return the machine's rules after the change.
// The rules persist across stop/start and go with the machine.
type Firewaller interface {
	OpenPorts(ctx context.Context, rules []PortRule) ([]PortRule, error)
	ClosePorts(ctx context.Context, rules []PortRule) ([]PortRule, error)
	Ports(ctx context.Context) ([]PortRule, error)
}
