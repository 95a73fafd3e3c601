package sandbox

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The firewall: ingress rules per machine, enforced on the bridge with nftables (netlink, no
// nft binary). Each manager has one table of the bridge family, "kloud-fw-<bridge>", with one
// chain on the bridge's forward hook: frames between two machines of the bridge. Frames from
// the host (kloud, the agents' traffic) take the output hook and are never filtered. The table
// is rebuilt whole, in one netlink transaction, from the machines' records and their
// firewall.json whenever a machine's network comes up, a machine goes, its tags or its rules
// change; TeardownNetwork deletes it.
//
// Policy for a frame to machine M from machine X (IPv4; ARP and the rest pass):
//   - X has M's owner (tag kloud_owner; without one, the stack: tag kloud_stack; machines with
//     neither, which kloud never makes, are one group): accepted;
//   - else a rule of M's opens the protocol and port to X: from "any", "team" (same kloud_team
//     tag), or a CIDR holding X's address ("owner" adds nothing, "kloud" is always open);
//   - else new connections are dropped: TCP SYN without ACK, UDP, ICMP echo requests. Replies
//     to M's own TCP connections and ICMP errors pass (the filter is stateless: UDP answers
//     to M's own requests to X are dropped too unless a rule opens M's port).

// Firewall sources.
const (
	FromKloud = "kloud" // the kloud host (always allowed)
	FromOwner = "owner" // the machine owner's other machines (allowed by default)
	FromTeam  = "team"  // machines of the owner's team
	FromAny   = "any"   // every machine
)

// Tags the firewall reads (kloud's provider sets them).
const (
	fwTagOwner = "kloud_owner"
	fwTagTeam  = "kloud_team"
	fwTagStack = "kloud_stack"
)

// FirewallRule opens Port/Protocol of a machine to From.
type FirewallRule struct {
	Port     int    `json:"port"`
	Protocol string `json:"protocol"` // tcp or udp
	From     string `json:"from"`     // kloud, owner, team, any, or an IPv4 CIDR
}

// Check validates r and normalises it (protocol lower case, CIDR masked).
func (r *FirewallRule) Check() error {
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

// firewallFile is a machine's rules.
type firewallFile struct {
	Rules []FirewallRule `json:"rules"`
}

func (m *Manager) firewallPath(id string) string {
	return filepath.Join(m.machineDir(id), "firewall.json")
}

// Firewall returns the machine's rules.
func (m *Manager) Firewall(ctx context.Context, id string) ([]FirewallRule, error) {
	if _, err := m.loadRecord(id); err != nil {
		return nil, fmt.Errorf("firewall of machine %q: %w", id, notFound(err))
	}
	f, err := m.loadFirewall(id)
	if err != nil {
		return nil, err
	}
	return f.Rules, nil
}

// OpenPorts adds rules (present ones are kept once) and applies the firewall.
func (m *Manager) OpenPorts(ctx context.Context, id string, rules []FirewallRule) ([]FirewallRule, error) {
	return m.changeFirewall(ctx, id, rules, true)
}

// ClosePorts removes rules (absent ones are ignored) and applies the firewall.
func (m *Manager) ClosePorts(ctx context.Context, id string, rules []FirewallRule) ([]FirewallRule, error) {
	return m.changeFirewall(ctx, id, rules, false)
}

func (m *Manager) changeFirewall(ctx context.Context, id string, rules []FirewallRule, open bool) ([]FirewallRule, error) {
	for i := range rules {
		if err := rules[i].Check(); err != nil {
			return nil, err
		}
	}
	l, _, err := m.lockRecord(ctx, id, "change firewall of machine")
	if err != nil {
		return nil, err
	}
	defer l.unlock()
	f, err := m.loadFirewall(id)
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		i := slices.Index(f.Rules, r)
		switch {
		case open && i < 0:
			f.Rules = append(f.Rules, r)
		case !open && i >= 0:
			f.Rules = slices.Delete(f.Rules, i, i+1)
		}
	}
	b, _ := json.MarshalIndent(f, "", "  ")
	tmp := m.firewallPath(id) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}
	if err := os.Rename(tmp, m.firewallPath(id)); err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}
	if err := m.ApplyFirewall(ctx); err != nil {
		return nil, err
	}
	return f.Rules, nil
}

func (m *Manager) loadFirewall(id string) (firewallFile, error) {
	var f firewallFile
	b, err := os.ReadFile(m.firewallPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("firewall: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("firewall: %s: %w", m.firewallPath(id), err)
	}
	return f, nil
}

func notFound(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNotFound
	}
	return err
}

// FirewallTable is the name of the manager's nftables table (family bridge).
func (m *Manager) FirewallTable() string { return "kloud-fw-" + m.bridge }

// fwMachine is what the ruleset needs of one machine.
type fwMachine struct {
	id, veth, group, team string
	ip                    netip.Addr
	rules                 []FirewallRule
}

// ApplyFirewall rebuilds the manager's table from every machine's record and rules, in one
// transaction (no moment without rules).
func (m *Manager) ApplyFirewall(ctx context.Context) error {
	m.fwMu.Lock()
	defer m.fwMu.Unlock()
	ids, err := m.machineIDs()
	if err != nil {
		return err
	}
	var ms []fwMachine
	for _, id := range ids {
		r, err := m.loadRecord(id)
		if err != nil || !r.IP.IsValid() || r.HostVeth == "" {
			continue // half-made or gone: no address on the bridge
		}
		f, err := m.loadFirewall(id)
		if err != nil {
			return err
		}
		group := r.Tags[fwTagOwner]
		switch {
		case group != "":
			group = "owner:" + group
		case r.Tags[fwTagStack] != "":
			group = "stack:" + r.Tags[fwTagStack]
		default:
			group = "untagged"
		}
		ms = append(ms, fwMachine{id: id, veth: r.HostVeth, group: group, team: r.Tags[fwTagTeam], ip: r.IP, rules: f.Rules})
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("firewall: nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: m.FirewallTable()}
	c.AddTable(t) // so that the delete finds it on the first run
	c.DelTable(t)
	c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, rule := range rulesFor(ms) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: rule})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("firewall: apply table %s: %w", t.Name, err)
	}
	return nil
}

// removeFirewall deletes the manager's table (TeardownNetwork).
func (m *Manager) removeFirewall() error {
	m.fwMu.Lock()
	defer m.fwMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("firewall: nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: m.FirewallTable()}
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("firewall: delete table %s: %w", t.Name, err)
	}
	return nil
}

// rulesFor is the chain: per destination machine, its accepts, then its drops.
func rulesFor(ms []fwMachine) [][]expr.Any {
	var out [][]expr.Any
	for _, dst := range ms {
		to := []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(dst.veth)},
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x08, 0x00}}, // IPv4
		}
		rule := func(parts ...[]expr.Any) []expr.Any {
			r := slices.Clone(to)
			for _, p := range parts {
				r = append(r, p...)
			}
			return r
		}
		// The owner's other machines: everything.
		for _, src := range ms {
			if src.id != dst.id && src.group == dst.group {
				out = append(out, rule(saddr(netip.PrefixFrom(src.ip, 32)), verdict(expr.VerdictAccept)))
			}
		}
		for _, r := range dst.rules {
			port := append(proto(r.Protocol), dport(r.Port)...)
			switch r.From {
			case FromAny:
				out = append(out, rule(port, verdict(expr.VerdictAccept)))
			case FromTeam:
				for _, src := range ms {
					if src.id != dst.id && dst.team != "" && src.team == dst.team {
						out = append(out, rule(saddr(netip.PrefixFrom(src.ip, 32)), port, verdict(expr.VerdictAccept)))
					}
				}
			case FromKloud, FromOwner:
			default:
				if p, err := netip.ParsePrefix(r.From); err == nil {
					out = append(out, rule(saddr(p), port, verdict(expr.VerdictAccept)))
				}
			}
		}
		// New connections from anyone else.
		out = append(out,
			rule(proto("tcp"), []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}}, // SYN without ACK
			}, verdict(expr.VerdictDrop)),
			rule(proto("udp"), verdict(expr.VerdictDrop)),
			rule(proto("icmp"), []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{8}}, // echo request
			}, verdict(expr.VerdictDrop)),
		)
	}
	return out
}

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n+"\x00")
	return b
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func proto(p string) []expr.Any {
	n := map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "icmp": unix.IPPROTO_ICMP}[p]
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 9, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{n}},
	}
}

func dport(port int) []expr.Any {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, uint16(port))
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func saddr(p netip.Prefix) []expr.Any {
	a := p.Masked().Addr().As4()
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}}
	if p.Bits() < 32 {
		mask := make([]byte, 4)
		binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]})
}
