package docker_test

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/providers/docker"
)

// kloud's machine network lives as long as a container on it: a build makes it, the delete of
// the last container through the proxy (terraform destroy) and GC remove it; a stopped or
// created container keeps it; creates racing the removal always find a network (the proxy
// makes it again). Real dockerd (dockertest), the proxy driven by the Docker client as
// terraform's provider drives it, with a stack token from ApplyTemplate.
func TestNetworkFollowsMachines(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "net1")
	ctx := t.Context()
	cli := f.dd.Client
	owners := make([]string, 8)
	for i := range owners {
		owners[i] = "alice"
	}
	pc, image := f.stackProxy(t, owners) // machines m0..m7
	exists := func() bool {
		_, err := cli.NetworkInspect(ctx, f.d.Network(), client.NetworkInspectOptions{})
		if err != nil && !cerrdefs.IsNotFound(err) {
			t.Fatalf("inspect network: %v", err)
		}
		return err == nil
	}
	create := func(m string) (string, error) {
		c, err := pc.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "kloud-" + m,
			Config: &container.Config{Image: image, Entrypoint: []string{docker.BootPath},
				Labels: map[string]string{docker.LabelStack: "s1", docker.LabelMachine: m, docker.LabelInstance: "net1", docker.LabelOwner: "alice"}},
			HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(f.d.Network())}})
		return c.ID, err
	}
	remove := func(id string) error {
		_, err := pc.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true})
		return err
	}
	if !exists() {
		t.Fatal("ApplyTemplate did not make the network")
	}
	c0, err := create("m0")
	if err != nil {
		t.Fatal(err)
	}
	c1, err := create("m1")
	if err != nil {
		t.Fatal(err)
	}
	// Created, never started: the network's own list of containers is empty, and it stays.
	if err := f.d.RemoveNetwork(ctx); err != nil || !exists() {
		t.Fatalf("RemoveNetwork with two containers on it: %v, network exists %v", err, exists())
	}
	if err := remove(c1); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("the network went with a container still on it")
	}
	if err := remove(c0); err != nil {
		t.Fatal(err)
	}
	if exists() {
		t.Fatal("the network stayed after the delete of its last container through the proxy")
	}

	// Builds and destroys racing: every create finds its network.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 4 {
		wg.Go(func() {
			for range 3 {
				m := fmt.Sprintf("m%d", g)
				id, err := create(m)
				if err != nil {
					errs <- fmt.Errorf("create %s: %w", m, err)
					return
				}
				if err := remove(id); err != nil {
					errs <- fmt.Errorf("remove %s: %w", m, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if exists() {
		t.Error("the network stayed after the racing builds removed their containers")
	}

	// GC that removes nothing leaves the network (kloud serve makes it before it listens, then
	// sweeps); GC takes it with the last container it removes.
	if err := f.d.EnsureNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	if gone, err := f.d.GC(ctx, func(stack, machine string) bool { return false }); err != nil || len(gone) != 0 || !exists() {
		t.Fatalf("GC without containers: removed %v, %v; network exists %v", gone, err, exists())
	}
	if _, err := create("m5"); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("a create through the proxy did not make the network again")
	}
	gone, err := f.d.GC(ctx, func(stack, machine string) bool { return false })
	if err != nil || len(gone) != 1 {
		t.Fatalf("GC: removed %v, %v", gone, err)
	}
	if exists() {
		t.Error("GC left the network without containers")
	}

	// A kloud reached at the network's gateway (it listens there) keeps the network: it holds
	// kloud's own address.
	gw := f.d.Gateway()
	on, err := docker.New(docker.Options{Host: f.dd.Host, Image: f.dd.Image, Instance: "net1", Endpoint: "http://" + gw.String() + ":1",
		StateDir: t.TempDir(), Network: f.d.Network(), Bridge: "kt-net1", Subnet: netip.PrefixFrom(gw, 24).Masked()})
	if err != nil {
		t.Fatal(err)
	}
	if err := on.EnsureNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	if err := on.RemoveNetwork(ctx); err != nil || !exists() {
		t.Errorf("RemoveNetwork of a kloud on the gateway: %v; network exists %v (want kept)", err, exists())
	}
	if err := f.d.RemoveNetwork(ctx); err != nil || exists() {
		t.Errorf("cleanup: %v", err)
	}
}
