package dockertest_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
	subnet, release, err := sandbox.FreeSubnet(150)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
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

// The daemon's containerd writes its stack dump (containerd.<pid>.stacks.log: dockerd asks a
// containerd that is slow to answer or to stop for it, with SIGUSR1, before killing it) into the
// run's own directory, not the machine's temporary directory: after Close nothing of it is left
// in os.TempDir().
func TestNoTempFilesLeft(t *testing.T) {
	if why := dockertest.Unavailable(); why != "" {
		testutil.Unavailable(t, "%s", why)
	}
	d, err := dockertest.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			d.Close()
		}
	}()
	pid := containerdPid(t, d)
	dump := filepath.Join(os.TempDir(), "containerd."+strconv.Itoa(pid)+".stacks.log")
	t.Cleanup(func() { os.Remove(dump) }) // its own file, if the test fails
	// What dockerd does to a containerd that does not answer (its killDaemon), short of the kill.
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(d.Dir, "tmp", filepath.Base(dump))
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := os.Stat(want)
		_, errTmp := os.Stat(dump)
		return err == nil || errTmp == nil
	}, "containerd (pid %d) wrote no stack dump after SIGUSR1", pid)
	closed = true
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dump); err == nil {
		t.Errorf("%s left in the machine's temporary directory: dockerd's containerd does not use the run's TMPDIR", dump)
	}
	if _, err := os.Stat(d.Dir); !os.IsNotExist(err) {
		t.Errorf("%s left: %v", d.Dir, err)
	}
}

// containerdPid is the pid of the containerd the daemon started (the daemon writes it under its
// exec root).
func containerdPid(t *testing.T, d *dockertest.Daemon) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.Dir, "exec", "containerd", "containerd.pid"))
	if err != nil {
		t.Fatalf("the daemon's containerd pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		t.Fatalf("the daemon's containerd pid file: %q %v", b, err)
	}
	comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if strings.TrimSpace(string(comm)) != "containerd" {
		t.Fatalf("pid %d is %q, not the daemon's containerd", pid, comm)
	}
	return pid
}
