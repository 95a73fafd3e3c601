package api

import (
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/provider/ptype"
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
type PortRule = ptype.PortRule

// PortsParams are the params of machine.ports.open and machine.ports.close. A rule without
// protocol or from opens tcp from any; to close, it stands for every protocol or every source
// of its port (close {port: 8000} closes 8000/tcp from team as well as from any).
type PortsParams struct {
	MachineID string     `json:"machineId"`
	Rules     []PortRule `json:"rules"`
}

// Validate implements kite.Validator. It checks and normalizes the rules' fields that are set
// (protocol in lower case, CIDRs masked) and leaves protocol and from empty when they are
// (the handlers read them: open as tcp and any, close as every protocol and every source).
func (p *PortsParams) Validate() error {
	if p.MachineID == "" {
		return errors.New("machineId is required")
	}
	if len(p.Rules) == 0 || len(p.Rules) > 64 {
		return errors.New("rules: give 1-64 rules, e.g. [{\"port\": 8000, \"protocol\": \"tcp\", \"from\": \"team\"}]")
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		n := *r
		if err := n.Normalize(); err != nil {
			return fmt.Errorf("rules[%d]: %w", i, err)
		}
		if r.Protocol != "" {
			r.Protocol = n.Protocol
		}
		if r.From != "" {
			r.From = n.From
		}
	}
	return nil
}

// PortsNotOpenType is the data.type of machine.ports.close's refusal (-32003) to close rules
// that are not open; its data.details is a PortsNotOpen.
const PortsNotOpenType = "portsNotOpen"

// PortsNotOpen says which rules of a machine.ports.close matched nothing (as given: protocol
// or from empty for every one) and which rules the machine has.
type PortsNotOpen struct {
	MachineID string     `json:"machineId"`
	NotOpen   []PortRule `json:"notOpen"`
	Open      []PortRule `json:"open"`
}

// PortsResult is the result of the machine.ports.* methods: the machine's rules now.
type PortsResult struct {
	MachineID string     `json:"machineId"`
	Rules     []PortRule `json:"rules"`
}
