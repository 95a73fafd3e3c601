package ptype

import (
	"fmt"
	"net/netip"
	"strings"
)

// Sources a rule opens a port to (PortRule.From), besides an IPv4 CIDR.
const (
	FromKloud = "kloud" // the kloud host: always open (the agent's traffic)
	FromOwner = "owner" // the owner's other machines: open by default
	FromTeam  = "team"  // machines of the stack's team
	FromAny   = "any"   // any machine or address
)

// PortRule opens Port/Protocol of a machine to From.
type PortRule struct {
	Port     int    `json:"port"`
	Protocol string `json:"protocol,omitempty"` // tcp (default) or udp
	From     string `json:"from,omitempty"`     // kloud, owner, team, any (default) or an IPv4 CIDR
}

// Normalize checks r and fills its defaults (tcp, any; a bare address becomes a /32; CIDRs
// are masked).
func (r *PortRule) Normalize() error {
	if r.Port < 1 || r.Port > 65535 {
		return fmt.Errorf("port %d: want 1-65535", r.Port)
	}
	r.Protocol = strings.ToLower(r.Protocol)
	if r.Protocol == "" {
		r.Protocol = "tcp"
	}
	if r.Protocol != "tcp" && r.Protocol != "udp" {
		return fmt.Errorf("protocol %q: want tcp or udp", r.Protocol)
	}
	switch r.From {
	case "":
		r.From = FromAny
		return nil
	case FromKloud, FromOwner, FromTeam, FromAny:
		return nil
	}
	p, err := netip.ParsePrefix(r.From)
	if err != nil {
		a, aerr := netip.ParseAddr(r.From)
		if aerr != nil {
			return fmt.Errorf("from %q: want kloud, owner, team, any or an IPv4 CIDR", r.From)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if !p.Addr().Is4() {
		return fmt.Errorf("from %q: want an IPv4 CIDR", r.From)
	}
	r.From = p.Masked().String()
	return nil
}

// String is "8000/tcp from any".
func (r PortRule) String() string { return fmt.Sprintf("%d/%s from %s", r.Port, r.Protocol, r.From) }
