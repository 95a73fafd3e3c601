package bridgefw

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// tablePrefix starts the name of every table NewTable makes.
const tablePrefix = "kloud-fw-"

// RemoveOrphans deletes the tables of bridges that are gone (a bridge deleted outside kloud, a
// kloud killed before it tidied) whose machines' subnet overlaps subnet, with kloud's rule for
// them in the host's iptables FORWARD chains. Such a table is harmful, not just untidy: its
// drops of new connections to its subnet apply to every bridge of the host (the bridge family
// cannot name the bridge on every kernel), so a bridge made later on that subnet gets no traffic
// between its machines. Tables of other subnets are left alone (another program's bridge may
// not exist yet). It returns the names of the tables it removed.
func RemoveOrphans(ctx context.Context, subnet netip.Prefix) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("firewall: nftables: %w", err)
	}
	defer c.CloseLasting()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyBridge)
	if err != nil {
		return nil, fmt.Errorf("firewall: list tables: %w", err)
	}
	var removed []string
	var errs []error
	for _, tb := range tables {
		bridge, ok := strings.CutPrefix(tb.Name, tablePrefix)
		if !ok || bridge == "" {
			continue
		}
		if _, err := net.InterfaceByName(bridge); err == nil {
			continue // its bridge is there: someone's live firewall
		}
		sub, err := tableSubnet(c, tb)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !sub.IsValid() || !sub.Overlaps(subnet) {
			continue
		}
		if err := NewTable(bridge, sub).Remove(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, tb.Name)
	}
	return removed, errors.Join(errs...)
}

// tableSubnet reads the subnet of a table chain made: the destination prefix of its rules that
// match an address and name no port (the drops to the whole subnet). No such rule: the zero
// Prefix.
func tableSubnet(c *nftables.Conn, tb *nftables.Table) (netip.Prefix, error) {
	chains, err := c.ListChainsOfTableFamily(tb.Family)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("firewall: table %s: chains: %w", tb.Name, err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != tb.Name {
			continue
		}
		rules, err := c.GetRules(tb, ch)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("firewall: table %s: rules: %w", tb.Name, err)
		}
		for _, r := range rules {
			if p, ok := ruleSubnet(r.Exprs); ok {
				return p, nil
			}
		}
	}
	return netip.Prefix{}, nil
}

// ruleSubnet is daddr's prefix in a rule without an interface match.
func ruleSubnet(exprs []expr.Any) (netip.Prefix, bool) {
	for _, e := range exprs {
		if m, ok := e.(*expr.Meta); ok && (m.Key == expr.MetaKeyIIFNAME || m.Key == expr.MetaKeyOIFNAME) {
			return netip.Prefix{}, false // a machine's rule
		}
	}
	for i, e := range exprs {
		p, ok := e.(*expr.Payload)
		if !ok || p.Base != expr.PayloadBaseNetworkHeader || p.Offset != 16 || p.Len != 4 {
			continue
		}
		bits := 32
		j := i + 1
		if j < len(exprs) {
			if b, ok := exprs[j].(*expr.Bitwise); ok && len(b.Mask) == 4 {
				bits = 0
				for m := binary.BigEndian.Uint32(b.Mask); m&(1<<31) != 0; m <<= 1 {
					bits++
				}
				j++
			}
		}
		if j < len(exprs) {
			if cmp, ok := exprs[j].(*expr.Cmp); ok && cmp.Op == expr.CmpOpEq && len(cmp.Data) == 4 {
				return netip.PrefixFrom(netip.AddrFrom4([4]byte(cmp.Data)), bits).Masked(), true
			}
		}
	}
	return netip.Prefix{}, false
}
