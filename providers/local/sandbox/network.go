package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/providers/bridgefw"
)

// Networking uses iproute2 (`ip`). The bridge carries HostAddr (.1); each machine has a named
// network namespace (/run/netns/kd-<manager>-<machine>) holding lo and eth0, the peer of a veth
// whose host end (kdh<hash>) is enslaved to the bridge. The namespace has one route, the bridge
// subnet: no default route, and this package never enables ip_forward or NAT, so a machine
// reaches the host's bridge address and the other machines and nothing else.

const netnsDir = "/run/netns"

// ip runs `ip args...` and returns its stdout.
func (m *Manager) ip(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, m.ipPath, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("ip %s: %s: %w", strings.Join(args, " "), strings.TrimSpace(stderr.String()), err)
	}
	return stdout.Bytes(), nil
}

func linkExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}

// isNsfs reports whether path is a mounted namespace file (what `ip netns add` leaves).
func isNsfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// SetupNetwork creates the bridge with HostAddr if it is missing. Create and Start call it; call it
// yourself before listening on HostAddr when no machine exists yet. It is idempotent.
func (m *Manager) SetupNetwork(ctx context.Context) error {
	g, err := m.lockGlobal(ctx)
	if err != nil {
		return err
	}
	defer g.unlock()
	if err := m.ensureBridge(ctx); err != nil {
		return err
	}
	// A table left by a bridge of this subnet that is gone would drop the new bridge's traffic
	// between its machines (bridgefw.RemoveOrphans).
	if removed, err := bridgefw.RemoveOrphans(ctx, m.subnet); err != nil {
		m.log.Warn("firewall: tables of bridges that are gone", "err", err)
	} else if len(removed) > 0 {
		m.log.Info("firewall: removed the tables of bridges that are gone", "tables", removed, "subnet", m.subnet)
	}
	// The host's iptables may drop bridged frames (a stock dockerd's FORWARD policy): kloud's
	// ACCEPT for the bridge's own traffic (firewall.go), before a machine needs it.
	m.fw.AllowHostForward(ctx)
	return nil
}

func (m *Manager) ensureBridge(ctx context.Context) error {
	br := m.bridge
	if !linkExists(br) {
		if _, err := m.ip(ctx, "link", "add", br, "type", "bridge"); err != nil && !linkExists(br) {
			return fmt.Errorf("create bridge: %w", err)
		}
		m.log.Info("created bridge", "bridge", br, "addr", m.HostAddr())
	}
	out, err := m.ip(ctx, "-j", "-4", "addr", "show", "dev", br)
	if err != nil {
		return fmt.Errorf("bridge address: %w", err)
	}
	var links []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return fmt.Errorf("bridge address: parse ip -j: %w", err)
	}
	have := false
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if a.Local == m.hostAddr.String() {
				have = true
			}
		}
	}
	if !have {
		// Another link with an address of this subnet (another kloud's bridge, a VPN, a LAN)
		// would take the replies to our machines: they could not reach kloud, and its own
		// machines would get our traffic. Say so rather than build machines that cannot boot.
		if other := subnetUser(m.subnet, br); other != "" {
			return fmt.Errorf("bridge address: subnet %s is already used by network interface %s on this host; choose another with --local-subnet", m.subnet, other)
		}
		cidr := m.hostAddr.String() + "/" + strconv.Itoa(m.subnet.Bits())
		if _, err := m.ip(ctx, "addr", "add", cidr, "dev", br); err != nil {
			return fmt.Errorf("bridge address: %w", err)
		}
	}
	// No IPv6 on our links: nothing to autoconfigure, no router solicitations.
	os.WriteFile("/proc/sys/net/ipv6/conf/"+br+"/disable_ipv6", []byte("1"), 0o644)
	// Never route what machines send, even on a host with ip_forward=1 (a machine's root could add
	// a default route via HostAddr): IPv4 forwarding off for packets received on the bridge.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+br+"/forwarding", []byte("0"), 0o644); err != nil {
		return fmt.Errorf("bridge forwarding off: %w", err)
	}
	if _, err := m.ip(ctx, "link", "set", br, "up"); err != nil {
		return fmt.Errorf("bridge up: %w", err)
	}
	return nil
}

// subnetUser names an interface other than self with an address in p, or "".
func subnetUser(p netip.Prefix, self string) string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifc := range ifs {
		if ifc.Name == self {
			continue
		}
		if addrs, err := ifc.Addrs(); err == nil && subnetInUse(p, addrs) {
			return ifc.Name
		}
	}
	return ""
}

// TeardownNetwork deletes the bridge. It refuses while machines exist in the state dir.
func (m *Manager) TeardownNetwork(ctx context.Context) error {
	ids, err := m.machineIDs()
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		return fmt.Errorf("teardown network: %d machines still exist (%s)", len(ids), strings.Join(ids, ", "))
	}
	g, err := m.lockGlobal(ctx)
	if err != nil {
		return err
	}
	defer g.unlock()
	if err := m.removeFirewall(ctx); err != nil {
		return fmt.Errorf("teardown network: %w", err)
	}
	if !linkExists(m.bridge) {
		return nil
	}
	if _, err := m.ip(ctx, "link", "del", m.bridge); err != nil && linkExists(m.bridge) {
		return fmt.Errorf("delete bridge: %w", err)
	}
	return nil
}

// ensureMachineNetwork creates the machine's namespace and veth pair if they are missing (first
// boot, or after a host reboot emptied /run/netns).
func (m *Manager) ensureMachineNetwork(ctx context.Context, r *record) error {
	nsPath := filepath.Join(netnsDir, r.Netns)
	if _, err := os.Stat(nsPath); err == nil && !isNsfs(nsPath) {
		os.Remove(nsPath) // a stale file left by a crash or reboot
	}
	if !isNsfs(nsPath) {
		if _, err := m.ip(ctx, "netns", "add", r.Netns); err != nil {
			return fmt.Errorf("create netns: %w", err)
		}
	}
	if _, err := m.ip(ctx, "-n", r.Netns, "link", "set", "lo", "up"); err != nil {
		return fmt.Errorf("netns lo: %w", err)
	}
	_, peerErr := m.ip(ctx, "-n", r.Netns, "link", "show", "eth0")
	if peerErr == nil && linkExists(r.HostVeth) {
		return m.upMachineLinks(ctx, r)
	}
	// Recreate the pair from scratch.
	if linkExists(r.HostVeth) {
		if _, err := m.ip(ctx, "link", "del", r.HostVeth); err != nil {
			return fmt.Errorf("delete stale veth: %w", err)
		}
	}
	if peerErr == nil {
		m.ip(ctx, "-n", r.Netns, "link", "del", "eth0")
	}
	if _, err := m.ip(ctx, "link", "add", r.HostVeth, "type", "veth", "peer", "name", r.PeerVeth, "netns", r.Netns); err != nil {
		return fmt.Errorf("create veth: %w", err)
	}
	os.WriteFile("/proc/sys/net/ipv6/conf/"+r.HostVeth+"/disable_ipv6", []byte("1"), 0o644)
	if _, err := m.ip(ctx, "-n", r.Netns, "link", "set", r.PeerVeth, "name", "eth0"); err != nil {
		return fmt.Errorf("rename veth: %w", err)
	}
	if _, err := m.ip(ctx, "-n", r.Netns, "link", "set", "eth0", "addrgenmode", "none"); err != nil {
		return fmt.Errorf("veth addrgenmode: %w", err)
	}
	cidr := r.IP.String() + "/" + strconv.Itoa(r.PrefixLen)
	if _, err := m.ip(ctx, "-n", r.Netns, "addr", "add", cidr, "dev", "eth0"); err != nil {
		return fmt.Errorf("machine address: %w", err)
	}
	return m.upMachineLinks(ctx, r)
}

func (m *Manager) upMachineLinks(ctx context.Context, r *record) error {
	if _, err := m.ip(ctx, "link", "set", r.HostVeth, "master", r.Bridge, "up"); err != nil {
		return fmt.Errorf("veth up: %w", err)
	}
	if _, err := m.ip(ctx, "-n", r.Netns, "link", "set", "eth0", "up"); err != nil {
		return fmt.Errorf("veth up: %w", err)
	}
	return nil
}

// validNetns and validVeth guard every name this package deletes.
func validNetns(name string) bool {
	return strings.HasPrefix(name, "kd-") && len(name) > 3 && !strings.ContainsAny(name, "/.")
}

func validVeth(name string) bool {
	return strings.HasPrefix(name, "kdh") && len(name) > 3 && len(name) <= 15 && !strings.ContainsAny(name, "/.")
}

// removeMachineNetwork deletes the veth pair and the namespace; missing parts are fine.
func (m *Manager) removeMachineNetwork(ctx context.Context, n names) error {
	var errs []error
	if validVeth(n.hostVeth) && linkExists(n.hostVeth) {
		if _, err := m.ip(ctx, "link", "del", n.hostVeth); err != nil && linkExists(n.hostVeth) {
			errs = append(errs, fmt.Errorf("delete veth: %w", err))
		}
	}
	if !validNetns(n.netns) {
		return errors.Join(errs...)
	}
	nsPath := filepath.Join(netnsDir, n.netns)
	if isNsfs(nsPath) {
		if _, err := m.ip(ctx, "netns", "del", n.netns); err != nil && isNsfs(nsPath) {
			errs = append(errs, fmt.Errorf("delete netns: %w", err))
		}
	}
	if err := os.Remove(nsPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("delete netns: %w", err))
	}
	return errors.Join(errs...)
}

// bridgePorts lists the interfaces enslaved to the bridge.
func (m *Manager) bridgePorts() []string {
	ents, err := os.ReadDir("/sys/class/net/" + m.bridge + "/brif")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// netnsOrphans lists the namespaces in /run/netns that belong to this manager.
func (m *Manager) netnsNames() []string {
	ents, err := os.ReadDir(netnsDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "kd-"+m.mgrHash+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}
