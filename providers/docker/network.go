package docker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// ensureNetwork creates the machines' network (a bridge with Options.Subnet, its Linux bridge
// named Options.Bridge: the firewall's table hooks that bridge) unless it exists, and checks
// that an existing one has that subnet.
func (d *Docker) ensureNetwork(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.netOK {
		return nil
	}
	cli, err := d.Client()
	if err != nil {
		return err
	}
	check := func(n network.Inspect) error {
		for _, c := range n.IPAM.Config {
			if c.Subnet == d.opts.Subnet {
				return nil
			}
		}
		return fmt.Errorf("docker network %s exists without subnet %s (remove it, or configure the docker provider's network and subnet)", d.opts.Network, d.opts.Subnet)
	}
	res, err := cli.NetworkInspect(ctx, d.opts.Network, client.NetworkInspectOptions{})
	if err == nil {
		if err := check(res.Network); err != nil {
			return err
		}
		d.netOK = true
		return nil
	}
	if !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("inspect docker network %s: %w", d.opts.Network, err)
	}
	_, err = cli.NetworkCreate(ctx, d.opts.Network, client.NetworkCreateOptions{
		Driver: "bridge",
		IPAM:   &network.IPAM{Config: []network.IPAMConfig{{Subnet: d.opts.Subnet, Gateway: d.Gateway()}}},
		Options: map[string]string{
			"com.docker.network.bridge.name": d.opts.Bridge,
		},
		Labels: map[string]string{LabelInstance: d.instance},
	})
	if err != nil && !cerrdefs.IsConflict(err) {
		return fmt.Errorf("create docker network %s (%s): %w", d.opts.Network, d.opts.Subnet, err)
	}
	d.netOK = true
	return nil
}

// EnsureNetwork is ensureNetwork; the first time in this process, and whenever it makes the
// network, it also rebuilds the firewall (firewall.go: containers may have run while kloud did
// not, or a host reboot emptied the kernel's tables).
func (d *Docker) EnsureNetwork(ctx context.Context) error {
	d.mu.Lock()
	ok := d.netOK
	d.mu.Unlock()
	if ok {
		return nil
	}
	if err := d.ensureNetwork(ctx); err != nil {
		return err
	}
	if err := d.ApplyFirewall(ctx); err != nil {
		return fmt.Errorf("docker network %s: %w", d.opts.Network, err)
	}
	return nil
}

// RemoveNetwork removes the machines' network if no container uses it, running or stopped (a
// stopped machine needs it to start again). A network in use stays. It waits for container
// creates in flight through the proxy, and they wait for it (Docker.netLife): a create that
// comes after finds the network gone and the proxy makes it again (EnsureNetwork), so a build
// never loses the network under it. Removal is not coordinated across kloud processes sharing a
// daemon and network name. A kloud reached at the network's gateway (onNetwork) keeps it.
func (d *Docker) RemoveNetwork(ctx context.Context) error {
	_, err := d.removeNetworkIfUnused(ctx)
	return err
}

// removeNetworkIfUnused is RemoveNetwork; removed says whether it removed the network.
func (d *Docker) removeNetworkIfUnused(ctx context.Context) (removed bool, err error) {
	// Containers went: the firewall follows (their rules go; the table goes with the network).
	defer func() {
		if removed {
			err = errors.Join(err, d.removeFirewall(ctx))
		} else {
			err = errors.Join(err, d.ApplyFirewall(ctx))
		}
	}()
	cli, err := d.Client()
	if err != nil {
		return false, err
	}
	if d.onNetwork() {
		return false, nil
	}
	d.netLife.Lock()
	defer d.netLife.Unlock()
	// Right after its last container went, the daemon may still list that container's endpoint
	// on the network, or refuse the removal with a store error ("error deleting network
	// endpoint count from store") while it releases it: an endpoint whose container no longer
	// exists does not count, and the removal is tried again for a moment (the next removal or
	// GC tries again anyway).
	deadline := time.Now().Add(3 * time.Second)
	for {
		used, exists, err := d.networkUsed(ctx, cli)
		if err != nil || used || !exists {
			return false, err
		}
		d.setNetOK(false)
		_, err = cli.NetworkRemove(ctx, d.opts.Network, client.NetworkRemoveOptions{})
		if err == nil || cerrdefs.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false, fmt.Errorf("remove docker network %s: %w", d.opts.Network, err)
		}
		d.log.Debug("docker provider: remove the machines' network: retrying", "network", d.opts.Network, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	d.log.Info("docker provider: removed the machines' network: no container uses it", "network", d.opts.Network)
	return true, nil
}

// networkUsed reports whether a container that exists (running, stopped or only created) is on
// the machines' network, and whether the network exists.
func (d *Docker) networkUsed(ctx context.Context, cli *client.Client) (used, exists bool, err error) {
	res, err := cli.NetworkInspect(ctx, d.opts.Network, client.NetworkInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		d.setNetOK(false)
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("inspect docker network %s: %w", d.opts.Network, err)
	}
	// Stopped and created containers are not in the network's list: ask every container.
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true})
	if err != nil {
		return false, true, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs.Items {
		if _, ok := res.Network.Containers[c.ID]; ok {
			return true, true, nil
		}
		if c.HostConfig.NetworkMode == d.opts.Network || c.HostConfig.NetworkMode == res.Network.ID {
			return true, true, nil
		}
		if c.NetworkSettings != nil && c.NetworkSettings.Networks[d.opts.Network] != nil {
			return true, true, nil
		}
	}
	return false, true, nil
}

// onNetwork reports whether kloud is reached on the network's own subnet (Options.Endpoint, where
// terraform reaches the proxy, is the gateway: kloud listens there). The network then carries
// kloud's own address and stays: removing it would cut terraform, the CLI and terraformer off
// from kloud until the next build.
func (d *Docker) onNetwork() bool {
	u, err := url.Parse(d.opts.Endpoint)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(u.Hostname())
	return err == nil && d.opts.Subnet.Contains(ip.Unmap())
}

func (d *Docker) setNetOK(ok bool) {
	d.mu.Lock()
	d.netOK = ok
	d.mu.Unlock()
}

// GC removes this kloud instance's containers whose stack or machine kloud no longer has (keep
// returns false for their ids): what a crash between terraform and kloud's store leaves. It
// never touches containers of another instance or without kloud's labels. It returns the ids of
// the containers it removed.
func (d *Docker) GC(ctx context.Context, keep func(stackID, machineID string) bool) ([]string, error) {
	cli, err := d.Client()
	if err != nil {
		return nil, err
	}
	cs, err := d.instanceContainers(ctx, cli)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, c := range cs {
		s, m := c.Labels[LabelStack], c.Labels[LabelMachine]
		if s == "" || m == "" || keep(s, m) {
			continue
		}
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove container %.12s: %w", c.ID, err))
			continue
		}
		removed = append(removed, c.ID)
	}
	// The network goes with the last container. Only when this sweep removed some: kloud serve
	// makes the network at startup, before it listens (it may listen on the gateway), and
	// sweeps right after.
	if len(removed) > 0 {
		if _, err := d.removeNetworkIfUnused(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// instanceContainers lists every container of this kloud instance, stopped ones too: those whose
// kloud_instance label is d's (the daemon's filter, checked again on each).
func (d *Docker) instanceContainers(ctx context.Context, cli *client.Client) ([]container.Summary, error) {
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true,
		Filters: make(client.Filters).Add("label", LabelInstance+"="+d.instance)})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	var out []container.Summary
	for _, c := range res.Items {
		if c.Labels[LabelInstance] == d.instance {
			out = append(out, c)
		}
	}
	return out, nil
}
