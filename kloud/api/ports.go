package api

import (
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/provider"
)

// Firewall methods (kloud/ports.go): a machine's ingress rules, kept and enforced by its
// provider (capability "firewall").
const (
	MethodMachinePortsOpen  = "machine.ports.open"
	MethodMachinePortsClose = "machine.ports.close"
	MethodMachinePortsList  = "machine.ports.list"
)

// PortRule is one ingress rule: port, protocol (tcp, udp), from (kloud, owner, team, any or an
// IPv4 CIDR).
type PortRule = provider.PortRule

// PortsParams are the params of machine.ports.open and machine.ports.close.
type PortsParams struct {
	MachineID string     `json:"machineId"`
	Rules     []PortRule `json:"rules"`
}

// Validate implements kite.Validator (and normalizes the rules: tcp and any by default).
func (p *PortsParams) Validate() error {
	if p.MachineID == "" {
		return errors.New("machineId is required")
	}
	if len(p.Rules) == 0 || len(p.Rules) > 64 {
		return errors.New("rules: give 1-64 rules, e.g. [{\"port\": 8000, \"protocol\": \"tcp\", \"from\": \"team\"}]")
	}
	for i := range p.Rules {
		if err := p.Rules[i].Normalize(); err != nil {
			return fmt.Errorf("rules[%d]: %w", i, err)
		}
	}
	return nil
}

// PortsResult is the result of the machine.ports.* methods: the machine's rules now.
type PortsResult struct {
	MachineID string     `json:"machineId"`
	Rules     []PortRule `json:"rules"`
}
