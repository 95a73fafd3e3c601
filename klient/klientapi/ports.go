package klientapi

import (
	"errors"
	"fmt"
)

// Port forwarding (docs/protocol.md "Port forwarding"): kloud asks a machine's klient to
// connect a TCP port of the machine to a tunnel WebSocket that klient dials back to kloud's
// attach endpoint (the terminal's, with its own one-time ticket). The tunnel's framing is
// package internal/tunnel's.
//
//	port.connect {port, token, attach: {url, ticket}} → {port}
//
// The token is the end user's (as for webterm.*): the owner and users with a terminal or full
// share may forward ports; a read-only share may not.
const MethodPortConnect = "port.connect"

// FeaturePortForward is in klient.info's features when klient serves port.connect.
const FeaturePortForward = "portForward"

// PortConnectParams are the params of port.connect.
type PortConnectParams struct {
	Port   int    `json:"port"`
	Token  string `json:"token"`
	Attach Attach `json:"attach"`
}

// Validate implements kite.Validator.
func (p *PortConnectParams) Validate() error {
	if err := CheckPort(p.Port); err != nil {
		return err
	}
	if p.Attach.URL == "" || p.Attach.Ticket == "" {
		return errors.New("attach.url and attach.ticket are required")
	}
	return nil
}

// PortConnectResult is the result of port.connect.
type PortConnectResult struct {
	Port int `json:"port"`
}

// CheckPort checks a TCP port number.
func CheckPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d: want 1-65535", port)
	}
	return nil
}
