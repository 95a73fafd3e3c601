// Package bridgefw is the machines' firewall on a Linux bridge: per-machine ingress rules
// enforced by one nftables table of the bridge family (google/nftables over netlink, no nft
// binary), rebuilt whole in one transaction from what a provider knows of its machines. The
// local provider (providers/local/sandbox, its machines' veths on its bridge) and the docker
// provider (providers/docker, its containers' veths on the kloud-machines network's bridge) use
// it; each keeps its machines' rules (Store) and calls Table.Apply whenever a machine comes up on
// the bridge, goes, or its tags or rules change, and Table.Remove with the bridge.
//
// Start reading at Table.Apply; the ruleset is built by chain (this file), rules and their
// files are in rules.go, and hostfw.go keeps the host's iptables (a stock dockerd's FORWARD
// policy DROP with br_netfilter on) from dropping what the table lets through.
//
// # Policy
//
// The table's one chain hooks the bridge family's forward hook: frames between two ports of a
// bridge. Frames from the host (kloud, agents' traffic) take the output hook and are never
// filtered. For an IPv4 frame from port S to machine M (ARP and the rest pass):
//   - a frame entering from a machine's port with another source address than the machine's is
//     dropped (no spoofing another machine's address, which the CIDR rules trust);
//   - S is the port of a machine of M's group (Group: its owner; without one, its stack): accepted;
//   - else a rule of M's opens the protocol and port to S: from "any", "team" (a machine whose
//     Team is M's), or a CIDR holding the frame's source address ("owner" adds nothing, "kloud"
//     is always open): accepted;
//   - else new connections to M are dropped: TCP SYN without ACK, UDP, ICMP echo requests; and
//     so are those to any address of the bridge's subnet, which covers a port the table does not
//     know yet (a machine the provider has not told it about): the firewall fails closed. Replies to M's own TCP connections
//     and ICMP errors pass (the filter is stateless: UDP answers to M's own requests to S are
//     dropped too unless a rule opens M's port).
//
// Machines are told apart by their bridge port (the host end of their veth), not by the source
// address alone: a machine with CAP_NET_RAW can write any source address.
package bridgefw

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/provider"
)

// Machine is what the table needs of one machine on the bridge.
type Machine struct {
	// ID names the machine (in errors only).
	ID string
	// Port is the machine's bridge port: the host end of its veth (1-15 bytes).
	Port string
	// IP is the machine's IPv4 address on the bridge.
	IP netip.Addr
	// Group: machines of one group reach each other (Group()).
	Group string
	// Team is the machine's team ("" for none: a "team" rule then opens nothing).
	Team string
	// Rules open the machine's ports (normalised: Rule.Normalize).
	Rules []Rule
}

// Group is the group of a machine from its tags: its owner, else its stack, else one group for
// all machines with neither (kloud never makes those).
func Group(owner, stack string) string {
	switch {
	case owner != "":
		return "owner:" + owner
	case stack != "":
		return "stack:" + stack
	}
	return "untagged"
}

// Table is one bridge's firewall: the nftables table Name (family bridge) filtering frames
// between the ports of the bridge whose machines have addresses in Subnet. Use NewTable.
type Table struct {
	Name   string
	Bridge string
	Subnet netip.Prefix
	// Log gets a warning when the host's iptables drop the bridge's traffic and kloud could not
	// accept it there (hostfw.go); nil: discarded.
	Log     *slog.Logger
	mu      sync.Mutex // one rebuild at a time
	blocked bool       // the last Apply found the bridge blocked (warned once)
}

// NewTable returns the firewall of bridge (table "kloud-fw-<bridge>") whose machines have
// addresses in subnet.
func NewTable(bridge string, subnet netip.Prefix) *Table {
	return &Table{Name: tablePrefix + bridge, Bridge: bridge, Subnet: subnet.Masked()}
}

// Apply replaces the table by the ruleset of machines ms, in one netlink transaction (there is
// no moment without rules). Machines without a port or an IPv4 address are left out (the
// catch-all drop covers their ports anyway). It also puts kloud's ACCEPT for the bridge's own
// traffic into the host's iptables FORWARD chains where it is missing (hostfw.go); when that
// fails where a FORWARD policy drops, it warns (Log) and goes on: the machines then cannot reach
// each other, which is closed, not open.
func (t *Table) Apply(ctx context.Context, ms []Machine) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fwd := t.AllowHostForward(ctx)
	t.mu.Lock()
	warn := fwd.Blocked() && !t.blocked
	t.blocked = fwd.Blocked()
	t.mu.Unlock()
	if warn && t.Log != nil {
		t.Log.Warn("firewall: " + fwd.String())
	}
	var in []Machine
	for _, m := range ms {
		if m.Port == "" || len(m.Port) >= unix.IFNAMSIZ || !m.IP.Is4() {
			continue
		}
		in = append(in, m)
	}
	return t.replace(func(c *nftables.Conn, tb *nftables.Table) {
		c.AddTable(tb)
		accept := nftables.ChainPolicyAccept
		ch := c.AddChain(&nftables.Chain{Name: "forward", Table: tb, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
		for _, rule := range chain(t.Subnet, in) {
			c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: rule})
		}
	})
}

// Remove deletes the table (with the bridge) and kloud's rule for the bridge in the host's
// iptables (hostfw.go). A missing table or rule is not an error.
func (t *Table) Remove(ctx context.Context) error {
	return errors.Join(t.replace(nil), removeHostForward(ctx, t.Bridge))
}

// replace deletes the table and, with fill, makes it again, in one transaction.
func (t *Table) replace(fill func(*nftables.Conn, *nftables.Table)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("firewall: nftables: %w", err)
	}
	defer c.CloseLasting()
	tb := &nftables.Table{Family: nftables.TableFamilyBridge, Name: t.Name}
	c.AddTable(tb) // so that the delete finds it when it is not there
	c.DelTable(tb)
	if fill != nil {
		fill(c, tb)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("firewall: table %s: %w", t.Name, err)
	}
	return nil
}

// Exists reports whether the table is in the kernel.
func (t *Table) Exists() (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("firewall: nftables: %w", err)
	}
	defer c.CloseLasting()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyBridge)
	if err != nil {
		return false, fmt.Errorf("firewall: list tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(tb *nftables.Table) bool { return tb.Name == t.Name }), nil
}

// Usable reports whether this process can manage nftables tables (nil), else why not (no
// CAP_NET_ADMIN, no nf_tables in the kernel).
func Usable() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	if _, err := c.ListTablesOfFamily(nftables.TableFamilyBridge); err != nil {
		return fmt.Errorf("nftables (bridge family): %w", err)
	}
	return nil
}

// chain is the forward chain: anti-spoofing per source port; per destination machine its
// accepts; then the drops of new connections to each machine and to the whole subnet.
func chain(subnet netip.Prefix, ms []Machine) [][]expr.Any {
	var out [][]expr.Any
	for _, src := range ms {
		a := src.IP.As4()
		out = append(out, join(iif(src.Port), ipv4(), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: a[:]},
		}, verdict(expr.VerdictDrop)))
	}
	for _, dst := range ms {
		to := join(oif(dst.Port), ipv4())
		// Its group's machines: everything.
		for _, src := range ms {
			if src.Port != dst.Port && src.Group == dst.Group {
				out = append(out, join(to, iif(src.Port), verdict(expr.VerdictAccept)))
			}
		}
		for _, r := range dst.Rules {
			port := join(proto(r.Protocol), dport(r.Port))
			switch r.From {
			case provider.FromAny:
				out = append(out, join(to, port, verdict(expr.VerdictAccept)))
			case provider.FromTeam:
				for _, src := range ms {
					if src.Port != dst.Port && dst.Team != "" && src.Team == dst.Team {
						out = append(out, join(to, iif(src.Port), port, verdict(expr.VerdictAccept)))
					}
				}
			case provider.FromKloud, provider.FromOwner:
			default:
				if p, err := netip.ParsePrefix(r.From); err == nil && p.Addr().Is4() {
					out = append(out, join(to, saddr(p), port, verdict(expr.VerdictAccept)))
				}
			}
		}
	}
	// New connections from anyone else: to each machine's port, and to any address of the
	// bridge's subnet (ports the table does not know yet; the bridge family's meta obrname, which
	// would name the bridge, needs nft_meta_bridge, which kernels may lack).
	drops := func(to []expr.Any) [][]expr.Any {
		return [][]expr.Any{
			join(to, proto("tcp"), []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}}, // SYN without ACK
			}, verdict(expr.VerdictDrop)),
			join(to, proto("udp"), verdict(expr.VerdictDrop)),
			join(to, proto("icmp"), []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{8}}, // echo request
			}, verdict(expr.VerdictDrop)),
		}
	}
	for _, dst := range ms {
		out = append(out, drops(join(oif(dst.Port), ipv4()))...)
	}
	if subnet.IsValid() && subnet.Addr().Is4() {
		out = append(out, drops(join(ipv4(), daddr(subnet)))...)
	}
	return out
}

func join(parts ...[]expr.Any) []expr.Any {
	var r []expr.Any
	for _, p := range parts {
		r = append(r, p...)
	}
	return r
}

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n+"\x00")
	return b
}

func iif(port string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(port)},
	}
}

func oif(port string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(port)},
	}
}

func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x08, 0x00}},
	}
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

func saddr(p netip.Prefix) []expr.Any { return addr(12, p) }

func daddr(p netip.Prefix) []expr.Any { return addr(16, p) }

// addr matches the IPv4 header's address at offset (12 source, 16 destination) against p.
func addr(offset uint32, p netip.Prefix) []expr.Any {
	a := p.Masked().Addr().As4()
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}}
	if p.Bits() < 32 {
		mask := make([]byte, 4)
		binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]})
}
