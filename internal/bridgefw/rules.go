package bridgefw

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strings"
)

// Sources a rule opens a port to (Rule.From), besides an IPv4 CIDR.
const (
	FromKloud = "kloud" // the kloud host (always allowed)
	FromOwner = "owner" // the machine owner's other machines (allowed by default)
	FromTeam  = "team"  // machines of the owner's team
	FromAny   = "any"   // every machine
)

// Rule opens Port/Protocol of a machine to From.
type Rule struct {
	Port     int    `json:"port"`
	Protocol string `json:"protocol"` // tcp or udp
	From     string `json:"from"`     // kloud, owner, team, any, or an IPv4 CIDR
}

// Check validates r and normalises it (protocol lower case, default tcp; a bare address becomes
// a /32, CIDRs are masked). From is required.
func (r *Rule) Check() error {
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
	case FromKloud, FromOwner, FromTeam, FromAny:
		return nil
	case "":
		return fmt.Errorf("from: want kloud, owner, team, any or a CIDR")
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
		return fmt.Errorf("from %q: only IPv4 (machines have no IPv6)", r.From)
	}
	r.From = p.Masked().String()
	return nil
}

// Change checks rules and returns have with them added (open; present ones are kept once) or
// removed (absent ones are ignored). have is not modified.
func Change(have, rules []Rule, open bool) ([]Rule, error) {
	out := slices.Clone(have)
	for _, r := range rules {
		if err := r.Check(); err != nil {
			return nil, err
		}
		i := slices.Index(out, r)
		switch {
		case open && i < 0:
			out = append(out, r)
		case !open && i >= 0:
			out = slices.Delete(out, i, i+1)
		}
	}
	return out, nil
}

// MaxRules bounds one machine's rules (a rule is a few chain rules per machine of the bridge).
const MaxRules = 256

// file is a machine's rules file.
type file struct {
	Rules []Rule `json:"rules"`
}

// Load reads a machine's rules file ({"rules": [...]}); a missing file is no rules. Rules that
// do not check are an error (the file is not the user's to write).
func Load(path string) ([]Rule, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("firewall: %s: %w", path, err)
	}
	for i := range f.Rules {
		if err := f.Rules[i].Check(); err != nil {
			return nil, fmt.Errorf("firewall: %s: %w", path, err)
		}
	}
	return f.Rules, nil
}

// Save writes a machine's rules file atomically (0600), at most MaxRules rules.
func Save(path string, rules []Rule) error {
	if len(rules) > MaxRules {
		return fmt.Errorf("firewall: %d rules: at most %d per machine (close some first)", len(rules), MaxRules)
	}
	if rules == nil {
		rules = []Rule{}
	}
	b, err := json.MarshalIndent(file{Rules: rules}, "", "  ")
	if err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("firewall: %w", err)
	}
	return nil
}
