package docker_test

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/docker"
)

// TestLimitsShown: a docker machine with cpus = "1" and memory = 512 started through the proxy
// (as terraform starts it) sees its limits as a local machine does: nproc says 1 and free 512 MB
// total in the machine's own processes (forked from its PID 1 after the start), /proc/meminfo and
// /sys/devices/system/cpu/online say the same to anyone in it, read-only; again after a restart
// (a new container process, a new mount namespace) and after its memory changed in place. A
// machine without limits sees the host's.
func TestLimitsShown(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	f := newFixture(t, "lim1")
	ctx := t.Context()
	cli := f.dd.Client
	pc, image := f.stackProxy(t, []string{"alice", "alice"})
	// PID 1 waits for /dev/go, then runs nproc and free: processes of the machine, started after
	// kloud's start hook, as the agent and its terminals are (/dev is a tmpfs of each start).
	const script = `while [ ! -e /dev/go ]; do sleep 0.1; done; (nproc; free -m) > /dev/out.tmp; mv /dev/out.tmp /dev/out; exec sleep infinity`
	create := func(m string, res container.Resources) string {
		t.Helper()
		c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "kloud-lim-" + m,
			Config: &container.Config{Image: image, Entrypoint: []string{"/bin/sh", "-c", script}, StopSignal: "SIGKILL",
				Labels: map[string]string{docker.LabelStack: "s1", docker.LabelMachine: m, docker.LabelInstance: "lim1", docker.LabelOwner: "alice"}},
			HostConfig: &container.HostConfig{NetworkMode: container.NetworkMode(f.d.Network()), Resources: res}})
		if err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	exec := func(id string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := f.dd.CLI(ctx, append([]string{"exec", id}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// seen returns what the machine's own processes saw: nproc, free's total (MB).
	seen := func(id string) (nproc, totalMB int) {
		t.Helper()
		exec(id, "touch", "/dev/go")
		var out string
		testutil.Eventually(t, 30*time.Second, func() bool {
			o, err := f.dd.CLI(ctx, "exec", id, "cat", "/dev/out")
			out = o
			return err == nil
		}, "the machine's processes did not run")
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			switch {
			case len(fs) == 1:
				nproc, _ = strconv.Atoi(fs[0])
			case len(fs) > 1 && fs[0] == "Mem:":
				totalMB, _ = strconv.Atoi(fs[1])
			}
		}
		return nproc, totalMB
	}
	hostMB := func() int {
		b, _ := os.ReadFile("/proc/meminfo")
		for _, l := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(l); len(fs) > 1 && fs[0] == "MemTotal:" {
				kb, _ := strconv.Atoi(fs[1])
				return kb >> 10
			}
		}
		return 0
	}()

	lim := create("m0", container.Resources{NanoCPUs: 1e9, Memory: 512 << 20})
	if _, err := pc.ContainerStart(ctx, lim, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if n, mb := seen(lim); n != 1 || mb != 512 {
			t.Errorf("%s: the machine's processes see nproc %d and %d MB total, want 1 and 512 (host: %d MB)", when, n, mb, hostMB)
		}
		if got := strings.TrimSpace(exec(lim, "cat", "/sys/devices/system/cpu/online")); got != "0" {
			t.Errorf("%s: cpu/online %q, want 0", when, got)
		}
		if got := exec(lim, "grep", "MemTotal", "/proc/meminfo"); !strings.Contains(got, " 524288 kB") {
			t.Errorf("%s: /proc/meminfo says %q, want 524288 kB", when, got)
		}
		if out, err := f.dd.CLI(ctx, "exec", lim, "sh", "-c", "echo 'MemTotal: 1 kB' > /proc/meminfo"); err == nil {
			t.Errorf("%s: the machine's root rewrote its /proc/meminfo: %s", when, out)
		}
	}
	check("started through the proxy")
	if _, err := pc.ContainerRestart(ctx, lim, client.ContainerRestartOptions{}); err != nil {
		t.Fatal(err)
	}
	check("restarted through the proxy")
	// Its memory changed in place through the proxy (a stack update): the view follows.
	if _, err := pc.ContainerUpdate(ctx, lim, client.ContainerUpdateOptions{Resources: &container.Resources{Memory: 384 << 20, MemorySwap: 768 << 20},
		RestartPolicy: &container.RestartPolicy{Name: "no"}}); err != nil {
		t.Fatalf("update the memory through the proxy: %v", err)
	}
	if got := exec(lim, "grep", "MemTotal", "/proc/meminfo"); !strings.Contains(got, " 393216 kB") {
		t.Errorf("after an update to 384 MB: /proc/meminfo says %q, want 393216 kB", got)
	}

	// A hostile root in the machine replaces kloud's file by a link before the next update:
	// kloud writes nothing through it (O_NOFOLLOW), neither in the machine nor on the host.
	exec(lim, "sh", "-c", "echo victim > /root/victim && rm -rf /dev/.kloud && mkdir /dev/.kloud && ln -s /root/victim /dev/.kloud/meminfo")
	hostHostname, _ := os.ReadFile("/etc/hostname")
	pc.ContainerUpdate(ctx, lim, client.ContainerUpdateOptions{Resources: &container.Resources{Memory: 320 << 20, MemorySwap: 640 << 20},
		RestartPolicy: &container.RestartPolicy{Name: "no"}}) // refused or not: what matters is what was written
	if got := strings.TrimSpace(exec(lim, "cat", "/root/victim")); got != "victim" {
		t.Errorf("kloud wrote through the machine's link: /root/victim holds %q", got)
	}
	if b, _ := os.ReadFile("/etc/hostname"); string(b) != string(hostHostname) {
		t.Errorf("the host's /etc/hostname changed: %q", b)
	}

	free := create("m1", container.Resources{})
	if _, err := pc.ContainerStart(ctx, free, client.ContainerStartOptions{}); err != nil {
		t.Fatal(err)
	}
	if n, mb := seen(free); n < 1 || mb < hostMB-1 || mb > hostMB {
		t.Errorf("a machine without limits sees nproc %d and %d MB, want the host's (%d MB)", n, mb, hostMB)
	}
}
