package dockertest_test

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// A private daemon with a running container on a bridge network of its own, closed: no
// process, mount, bridge or file of it is left.
func TestCloseLeavesNothing(t *testing.T) {
	if why := dockertest.Unavailable(); why != "" {
		testutil.Unavailable(t, "%s", why)
	}
	ctx := context.Background()
	d, err := dockertest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pidb, _ := os.ReadFile(d.Dir + "/d.pid")
	subnet, err := sandbox.FreeSubnet(150)
	if err != nil {
		t.Fatal(err)
	}
	const br = "kdt-close"
	if _, err := d.Client.NetworkCreate(ctx, "n", client.NetworkCreateOptions{Driver: "bridge",
		IPAM:    &network.IPAM{Config: []network.IPAMConfig{{Subnet: subnet}}},
		Options: map[string]string{"com.docker.network.bridge.name": br}}); err != nil {
		t.Fatal(err)
	}
	c, err := d.Client.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: d.Image, Entrypoint: []string{"sleep", "600"}},
		HostConfig: &container.HostConfig{NetworkMode: "n"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/sys/class/net/" + br); err != nil {
		t.Fatalf("bridge %s not there while the container runs: %v", br, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), d.Dir) {
		t.Errorf("mounts under %s left:\n%s", d.Dir, mi)
	}
	if _, err := os.Stat(d.Dir); !os.IsNotExist(err) {
		t.Errorf("%s left: %v", d.Dir, err)
	}
	if _, err := os.Stat("/sys/class/net/" + br); !os.IsNotExist(err) {
		t.Errorf("bridge %s left: %v", br, err)
	}
	var pid int
	for _, ch := range strings.TrimSpace(string(pidb)) {
		pid = pid*10 + int(ch-'0')
	}
	if pid <= 0 || syscall.Kill(pid, 0) == nil {
		t.Errorf("dockerd (pid %d) still runs", pid)
	}
}
