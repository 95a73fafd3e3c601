package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/kloud-dev/kloud/providers/bridgefw"
)

// The firewall: ingress rules per machine, enforced on the bridge by providers/bridgefw (one
// nftables table of the bridge family, "kloud-fw-<bridge>", filtering frames between the
// bridge's ports; the host's own traffic is never filtered). The table is rebuilt whole, in one
// netlink transaction, from the machines' records and their firewall.json whenever a machine's
// network comes up, a machine goes, its tags or its rules change; TeardownNetwork deletes it.
// The policy is bridgefw's: a machine is reached by the host and by the machines of its owner
// (tag kloud_owner; without one, its stack: tag kloud_stack); rules open a port to the team
// (tag kloud_team), a CIDR or any machine; other new connections are dropped. Beside a stock
// dockerd (br_netfilter on, iptables FORWARD policy DROP) the table's Apply, and SetupNetwork,
// keep kloud's ACCEPT for the bridge's own traffic in FORWARD (providers/bridgefw hostfw.go).

// Tags the firewall reads (kloud's provider sets them).
const (
	fwTagOwner = "kloud_owner"
	fwTagTeam  = "kloud_team"
	fwTagStack = "kloud_stack"
)

// FirewallRule opens Port/Protocol of a machine to From (provider.PortRule; Normalize checks it).
type FirewallRule = bridgefw.Rule

func (m *Manager) firewallPath(id string) string {
	return filepath.Join(m.machineDir(id), "firewall.json")
}

// Firewall returns the machine's rules.
func (m *Manager) Firewall(ctx context.Context, id string) ([]FirewallRule, error) {
	if _, err := m.loadRecord(id); err != nil {
		return nil, fmt.Errorf("firewall of machine %q: %w", id, notFound(err))
	}
	return bridgefw.Load(m.firewallPath(id))
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
	if _, err := bridgefw.Change(nil, rules, open); err != nil {
		return nil, err
	}
	l, _, err := m.lockRecord(ctx, id, "change firewall of machine")
	if err != nil {
		return nil, err
	}
	defer l.unlock()
	out, err := bridgefw.Update(m.firewallPath(id), rules, open)
	if err != nil {
		return nil, err
	}
	if err := m.ApplyFirewall(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

func notFound(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNotFound
	}
	return err
}

// FirewallTable is the name of the manager's nftables table (family bridge).
func (m *Manager) FirewallTable() string { return m.fw.Name }

// ApplyFirewall rebuilds the manager's table from every machine's record and rules, in one
// transaction (no moment without rules).
func (m *Manager) ApplyFirewall(ctx context.Context) error {
	m.fwMu.Lock()
	defer m.fwMu.Unlock()
	ids, err := m.machineIDs()
	if err != nil {
		return err
	}
	var ms []bridgefw.Machine
	for _, id := range ids {
		r, err := m.loadRecord(id)
		if err != nil || !r.IP.IsValid() || r.HostVeth == "" {
			continue // half-made or gone: no address on the bridge
		}
		rules, err := bridgefw.Load(m.firewallPath(id))
		if err != nil {
			return err
		}
		ms = append(ms, bridgefw.Machine{ID: id, Port: r.HostVeth, IP: r.IP, Rules: rules,
			Group: bridgefw.Group(r.Tags[fwTagOwner], r.Tags[fwTagStack]), Team: r.Tags[fwTagTeam]})
	}
	return m.fw.Apply(ctx, ms)
}

// removeFirewall deletes the manager's table (TeardownNetwork).
func (m *Manager) removeFirewall(ctx context.Context) error { return m.fw.Remove(ctx) }
