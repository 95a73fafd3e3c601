package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// The firewall on the plugin wire (capability "firewall", provider.Firewaller): kloud's proxy
// machine calls the plugin's machine.ports.open/close/list with the machine and the rules
// (normalized by kloud); the plugin's machine must implement provider.Firewaller.
const (
	MethodMachinePortsOpen  = "machine.portsOpen"
	MethodMachinePortsClose = "machine.portsClose"
	MethodMachinePorts      = "machine.ports"
)

// portsParams are the params of the three methods (rules: open and close only).
type portsParams struct {
	Machine wireMachine         `json:"machine"`
	Rules   []provider.PortRule `json:"rules,omitempty"`
}

func (p *portsParams) Validate() error {
	if p.Machine.ID == "" {
		return errors.New("machine.id is required")
	}
	for i := range p.Rules {
		if err := p.Rules[i].Normalize(); err != nil {
			return fmt.Errorf("rules[%d]: %w", i, err)
		}
	}
	return nil
}

// portsResult is their result: the machine's rules after the call.
type portsResult struct {
	Rules []provider.PortRule `json:"rules"`
}

var _ provider.Firewaller = (*proxyMachine)(nil)

func (m *proxyMachine) ports(ctx context.Context, method string, rules []provider.PortRule) ([]provider.PortRule, error) {
	if !m.can(provider.CapFirewall) {
		return nil, fmt.Errorf("provider %s: firewall: %w", m.name, provider.ErrUnsupported)
	}
	w, err := toWireMachine(m.b)
	if err != nil {
		return nil, err
	}
	var res portsResult
	if err := m.h.call(ctx, m.name, method, &portsParams{Machine: w, Rules: rules}, &res); err != nil {
		return nil, err
	}
	return res.Rules, nil
}

// OpenPorts implements provider.Firewaller.
func (m *proxyMachine) OpenPorts(ctx context.Context, rules []provider.PortRule) ([]provider.PortRule, error) {
	return m.ports(ctx, MethodMachinePortsOpen, rules)
}

// ClosePorts implements provider.Firewaller.
func (m *proxyMachine) ClosePorts(ctx context.Context, rules []provider.PortRule) ([]provider.PortRule, error) {
	return m.ports(ctx, MethodMachinePortsClose, rules)
}

// Ports implements provider.Firewaller.
func (m *proxyMachine) Ports(ctx context.Context) ([]provider.PortRule, error) {
	return m.ports(ctx, MethodMachinePorts, nil)
}

// handlePorts registers the plugin side.
func (s *server) handlePorts(k *kite.Kite) {
	for _, method := range []string{MethodMachinePortsOpen, MethodMachinePortsClose, MethodMachinePorts} {
		k.Handle(method, kite.Typed(func(ctx context.Context, _ *kite.Request, p *portsParams) (any, error) {
			m, err := s.machine(&p.Machine)
			if err != nil {
				return nil, err
			}
			fw, ok := m.(provider.Firewaller)
			if !ok {
				return nil, wireErr(fmt.Errorf("firewall: %w", provider.ErrUnsupported))
			}
			var rules []provider.PortRule
			switch method {
			case MethodMachinePortsOpen:
				rules, err = fw.OpenPorts(ctx, p.Rules)
			case MethodMachinePortsClose:
				rules, err = fw.ClosePorts(ctx, p.Rules)
			default:
				rules, err = fw.Ports(ctx)
			}
			if err != nil {
				return nil, wireErr(err)
			}
			if rules == nil {
				rules = []provider.PortRule{}
			}
			return portsResult{Rules: rules}, nil
		}))
	}
}
