package docker

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/bridgefw"
)

// The firewall (provider.Firewaller, docs/providers.md "Firewall"): per-machine ingress rules
// enforced by providers/bridgefw's nftables table on the machines' network's Linux bridge
// (Options.Bridge, named through the network's com.docker.network.bridge.name option), with the
// same policy as local machines: the kloud host and the owner's machines (label kloud_owner,
// else the stack's) reach a machine, other users' machines do not unless a rule opens a port to
// the team (label kloud_team), a CIDR or any machine.
//
// What the table is built from: the running containers of this kloud instance on the network
// (their address, labels, and their bridge port: the host end of the veth whose peer is the
// container's interface, found through /proc/<pid>/root/sys/class/net/*/iflink), and the rules
// in <StateDir>/firewall/<machine id>.json. It is rebuilt when a container starts (through the
// proxy: terraform's create and start; or Start), when containers are removed (the proxy's
// delete, GC, RemoveResource: rules of machines without a container go), when rules change,
// and the first time the network is ensured in a process; it is deleted with the network. A
// container the daemon restarts on its own (a restart policy, a daemon restart) gets a new
// bridge port the table does not know: it is unreachable from every machine (the table drops new
// connections to the whole subnet by default) until the next rebuild, which Watch (events.go,
// following the daemon's container events while kloud runs) does within moments; kloud asking
// for the machine's state does one too (Info rebuilds when a container started after the last
// rebuild).
//
// It needs the daemon on this host, in kloud's network namespace (a unix socket; the bridge
// then is a link kloud sees) and nftables (root, or CAP_NET_ADMIN): otherwise the provider does
// not advertise the capability (firewallUnusable says why). The table is of the bridge family
// and named kloud-fw-<bridge>; Docker's own rules (iptables, or its nftables backend) are of the
// ip/ip6 families and never touch it, so a host dockerd managing iptables keeps working: with
// br_netfilter loaded (such a daemon loads it), frames between machines pass both this table and
// Docker's FORWARD rules, and either may drop them. Traffic the host routes into the network
// (from the outside through Docker's NAT, from other Docker networks) comes from the host's
// side of the bridge and is not this table's: Docker's isolation rules govern it.
//
// A daemon that manages iptables adds its own ACCEPT for traffic within the network (its
// inter-container communication rule); one that does not (--iptables=false), on a host where
// another one set FORWARD's policy to DROP with br_netfilter on, would leave the machines unable
// to reach each other: the table puts kloud's own ACCEPT for the bridge's traffic into every
// iptables variant's FORWARD (bridgefw.Table.Apply; removed with the table). It accepts only what
// this table let through.

// fwDir is where the rules files are.
func (d *Docker) fwDir() string { return filepath.Join(d.opts.StateDir, "firewall") }

// fwIDRE is a machine id that is safe as a file name.
var fwIDRE = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$`)

func (d *Docker) fwPath(machineID string) (string, error) {
	if !fwIDRE.MatchString(machineID) {
		return "", fmt.Errorf("machine id %q is not a valid kloud machine id", machineID)
	}
	return filepath.Join(d.fwDir(), machineID+".json"), nil
}

// firewallUnusable says why this provider cannot filter its machines' traffic ("" if it can).
func firewallUnusable(host string) string {
	if err := onThisHost(host); err != nil {
		return err.Error() + ": its bridge is out of kloud's reach"
	}
	if err := bridgefw.Usable(); err != nil {
		return "kloud cannot manage nftables here (it needs root or CAP_NET_ADMIN): " + err.Error()
	}
	return ""
}

// FirewallUnusable says why the provider does not advertise the firewall capability ("" when it
// does).
func (d *Docker) FirewallUnusable() string { return d.fwWhy }

// FirewallTable is the nftables table (family bridge) of the machines' network, "" without a
// firewall.
func (d *Docker) FirewallTable() string {
	if d.fw == nil {
		return ""
	}
	return d.fw.Name
}

// HostForward says what the host's iptables do to frames between the machines on the network's
// bridge and whether kloud's ACCEPT for them is there (providers/bridgefw hostfw.go: Apply adds
// it), ok false without a firewall.
func (d *Docker) HostForward(ctx context.Context) (f bridgefw.Forward, ok bool) {
	if d.fw == nil {
		return bridgefw.Forward{}, false
	}
	return d.fw.HostForward(ctx), true
}

// ApplyFirewall rebuilds the firewall table from the running containers and their rules, and
// removes the rules of machines that no longer have a container. Without a firewall it does
// nothing.
func (d *Docker) ApplyFirewall(ctx context.Context) error {
	if d.fw == nil {
		return nil
	}
	d.fwMu.Lock()
	defer d.fwMu.Unlock()
	cli, err := d.Client()
	if err != nil {
		return err
	}
	began := time.Now()
	cs, err := d.instanceContainers(ctx, cli)
	if err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	_, brErr := os.Stat("/sys/class/net/" + d.opts.Bridge)
	have := map[string]bool{}
	var ms []bridgefw.Machine
	for _, c := range cs {
		lbl := c.Labels
		if lbl[LabelMachine] == "" {
			continue
		}
		have[lbl[LabelMachine]] = true
		if c.State != "running" && c.State != "restarting" {
			continue
		}
		in, err := cli.ContainerInspect(ctx, c.ID, client.ContainerInspectOptions{})
		if err != nil {
			continue // gone meanwhile
		}
		ct := in.Container
		if ct.State == nil || ct.State.Pid <= 0 || ct.NetworkSettings == nil || ct.NetworkSettings.Networks[d.opts.Network] == nil {
			continue
		}
		if brErr != nil {
			return fmt.Errorf("firewall: container %.12s runs on network %s, but its bridge %s is not in kloud's network namespace (is the Docker daemon in another one?): %w", c.ID, d.opts.Network, d.opts.Bridge, brErr)
		}
		ip := ct.NetworkSettings.Networks[d.opts.Network].IPAddress
		port, err := bridgePort(ct.State.Pid, d.opts.Bridge)
		if err != nil {
			d.log.Warn("docker provider: firewall: no bridge port for a container (it stays unreachable from other machines until the next rebuild)", "container", c.ID[:12], "err", err)
			continue
		}
		m := bridgefw.Machine{ID: lbl[LabelMachine], Port: port, IP: ip.Unmap(),
			Group: bridgefw.Group(lbl[LabelOwner], lbl[LabelStack]), Team: lbl[LabelTeam]}
		if path, err := d.fwPath(m.ID); err == nil {
			if m.Rules, err = bridgefw.Load(path); err != nil {
				return err
			}
		}
		ms = append(ms, m)
	}
	// A port two containers claim (a pid reused while we looked) is nobody's: closed.
	ports := map[string]int{}
	for _, m := range ms {
		ports[m.Port]++
	}
	ms = slices.DeleteFunc(ms, func(m bridgefw.Machine) bool { return ports[m.Port] > 1 })
	if brErr != nil {
		// No network (none yet, or it went): no table either.
		if err := d.fw.Remove(ctx); err != nil {
			return err
		}
	} else if err := d.fw.Apply(ctx, ms); err != nil {
		return err
	}
	d.fwBuilt = began
	// The rules of machines without a container go (they go with the machine, as local's).
	files, _ := os.ReadDir(d.fwDir())
	for _, f := range files {
		id, ok := strings.CutSuffix(f.Name(), ".json")
		if ok && !have[id] {
			os.Remove(filepath.Join(d.fwDir(), f.Name()))
		}
	}
	return nil
}

// removeFirewall deletes the table (with the network) and every rules file: no container is
// left.
func (d *Docker) removeFirewall(ctx context.Context) error {
	if d.fw == nil {
		return nil
	}
	d.fwMu.Lock()
	defer d.fwMu.Unlock()
	if err := os.RemoveAll(d.fwDir()); err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	return d.fw.Remove(ctx)
}

// bridgePort finds the bridge port (host veth) of the container whose init is pid: the host
// interface whose index an interface of the container names as its peer (iflink), and which
// is a port of bridge. The container cannot fake it: its /sys is the kernel's sysfs, read only,
// and the answer must be a port of kloud's bridge.
func bridgePort(pid int, bridge string) (string, error) {
	// A process in kloud's own network namespace is not a container's (its pid was reused).
	var self, its unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return "", err
	}
	if err := unix.Stat(filepath.Join("/proc", strconv.Itoa(pid), "ns/net"), &its); err != nil {
		return "", err
	}
	if self.Ino == its.Ino && self.Dev == its.Dev {
		return "", fmt.Errorf("process %d is in kloud's network namespace: not a container's", pid)
	}
	dir := filepath.Join("/proc", strconv.Itoa(pid), "root/sys/class/net")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if e.Name() == "lo" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "iflink"))
		if err != nil {
			continue
		}
		idx, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || idx <= 0 {
			continue
		}
		ifc, err := net.InterfaceByIndex(idx)
		if err != nil {
			continue
		}
		master, err := os.Readlink("/sys/class/net/" + ifc.Name + "/master")
		if err == nil && filepath.Base(master) == bridge {
			return ifc.Name, nil
		}
	}
	return "", fmt.Errorf("no interface of process %d is a port of bridge %s", pid, bridge)
}

// firewallAfterInfo rebuilds the table when a running container started after the last
// rebuild: the daemon restarted it on its own (a restart policy, a daemon restart), so its new
// bridge port is not in the table yet.
func (d *Docker) firewallAfterInfo(ctx context.Context, startedAt string) {
	if d.fw == nil {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, startedAt)
	d.fwMu.Lock()
	stale := err == nil && t.After(d.fwBuilt)
	d.fwMu.Unlock()
	if !stale {
		return
	}
	if err := d.ApplyFirewall(ctx); err != nil {
		d.log.Warn("docker provider: firewall after a restart behind kloud's back", "err", err)
	}
}

// firewallAfterStart rebuilds the table after a container started; on failure the container is
// stopped again (it would be open to every machine) and the error says why.
func (d *Docker) firewallAfterStart(ctx context.Context, id string) error {
	if d.fw == nil {
		return nil
	}
	err := d.ApplyFirewall(ctx)
	if err == nil {
		return nil
	}
	if cli, cerr := d.Client(); cerr == nil {
		timeout := 0
		cli.ContainerStop(context.WithoutCancel(ctx), id, client.ContainerStopOptions{Timeout: &timeout})
	}
	return fmt.Errorf("machine stopped again: its firewall could not be applied: %w", err)
}

// Firewaller: the machine's rules, keyed by its kloud machine id.

func (m *machine) fwPath(ctx context.Context) (string, error) {
	if m.d.fw == nil {
		return "", fmt.Errorf("docker machine %s: %s: %w", m.b.Label, m.d.fwWhy, provider.ErrUnsupported)
	}
	res, err := m.inspect(ctx)
	if err != nil {
		return "", err
	}
	id := m.b.ID
	if id == "" && res.Container.Config != nil {
		id = res.Container.Config.Labels[LabelMachine]
	}
	return m.d.fwPath(id)
}

func (m *machine) changePorts(ctx context.Context, op string, rules []provider.PortRule, open bool) ([]provider.PortRule, error) {
	if _, err := bridgefw.Change(nil, rules, open); err != nil {
		return nil, fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	path, err := m.fwPath(ctx)
	if err != nil {
		return nil, m.wrap(op, err)
	}
	m.d.fwMu.Lock()
	out, err := bridgefw.Update(path, rules, open)
	m.d.fwMu.Unlock()
	if err != nil {
		return nil, m.wrap(op, err)
	}
	if err := m.d.ApplyFirewall(ctx); err != nil {
		return nil, m.wrap(op, err)
	}
	return out, nil
}

// OpenPorts implements provider.Firewaller.
func (m *machine) OpenPorts(ctx context.Context, rules []provider.PortRule) ([]provider.PortRule, error) {
	return m.changePorts(ctx, "open ports of", rules, true)
}

// ClosePorts implements provider.Firewaller.
func (m *machine) ClosePorts(ctx context.Context, rules []provider.PortRule) ([]provider.PortRule, error) {
	return m.changePorts(ctx, "close ports of", rules, false)
}

// Ports implements provider.Firewaller.
func (m *machine) Ports(ctx context.Context) ([]provider.PortRule, error) {
	path, err := m.fwPath(ctx)
	if err != nil {
		return nil, m.wrap("list ports of", err)
	}
	rules, err := bridgefw.Load(path)
	if err != nil {
		return nil, m.wrap("list ports of", err)
	}
	return rules, nil
}

var _ provider.Firewaller = (*machine)(nil)
