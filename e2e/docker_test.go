package e2e

// End-to-end tests of the docker provider: containers on a private dockerd (dockertest), built
// by real terraform (the kreuzwerker/docker provider from the offline mirror) through kloud's
// Docker API proxy, with real cloud-init and the klient this kloud serves, through the kloud
// CLI. They need root, dockerd, the base image and the mirror's Docker provider; outside CI they
// skip loudly, under CI=true they fail.

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/userdata"
)

// dockerEnv is a kloud whose docker provider works on a private dockerd, with a terraformer of
// its own (a process apart from kloud, so it survives a SIGKILL of kloud).
type dockerEnv struct {
	*env
	dd      *dockertest.Daemon
	network string
}

// dockerMirror returns the Terraform CLI config of the offline mirror, which must hold
// kreuzwerker/docker (scripts/build-docker-provider.sh).
func dockerMirror(t *testing.T) string {
	t.Helper()
	cfg, mirror := os.Getenv("TF_CLI_CONFIG_FILE"), os.Getenv("TF_MIRROR")
	if cfg == "" || mirror == "" {
		testutil.Unavailable(t, "TF_CLI_CONFIG_FILE and TF_MIRROR are not set (source /var/cache/kloud/env)")
	}
	m, _ := filepath.Glob(filepath.Join(mirror, "registry.terraform.io/kreuzwerker/docker", docker.TerraformVersion, "*", "terraform-provider-docker_v*"))
	if len(m) == 0 {
		testutil.Unavailable(t, "the offline mirror %s has no kreuzwerker/docker %s (scripts/build-docker-provider.sh)", mirror, docker.TerraformVersion)
	}
	return cfg
}

func newDockerEnv(t *testing.T) *dockerEnv {
	t.Helper()
	cliConfig := dockerMirror(t)
	// The subnet first: its release then runs after the daemon's Close, which deletes the bridge
	// named after it. Released before (ci66), another test took the subnet and made its bridge
	// of that name, and this test's Close deleted it under that test's kloud ("listen
	// 10.200.217.1:…: cannot assign requested address").
	subnet, release, err := sandbox.FreeSubnet(150)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	dd := dockertest.New(t)
	network := fmt.Sprintf("kloud-e2e%d", subnet.Addr().As4()[2])
	// kloud creates the network at startup, before it listens on its gateway (where the machines
	// reach it, and terraform the proxy).
	_, port, _ := net.SplitHostPort(testutil.FreeLoopback(t))
	addr := net.JoinHostPort(subnet.Addr().Next().String(), port)
	e := newTerraformerEnv(t, addr, cliConfig, "--public-url", "http://"+addr, "--no-demo",
		// No --docker-image: kloud finds the image of $KLOUD_BASE_IMAGE (dockertest imported it)
		// as kloud serve does by default.
		"--docker-host", dd.Host, "--docker-network", network,
		"--docker-bridge", network, "--docker-subnet", subnet.String())
	return &dockerEnv{env: e, dd: dd, network: network}
}

func dockerTemplate(name string, n int) string {
	return fmt.Sprintf(`terraform {
  required_providers {
    docker = { source = "kreuzwerker/docker", version = "4.6.0" }
  }
}

provider "docker" {}

resource "docker_container" %q {
  count    = %d
  name     = "%s-${count.index}"
  image    = "kloud"
  hostname = "%s-${count.index}"
  memory   = 512
  cpus     = "1"
}
`, name, n, name, name)
}

// exec runs argv in container id.
func (e *dockerEnv) exec(id string, argv ...string) string {
	e.t.Helper()
	out, err := e.dd.CLI(e.t.Context(), append([]string{"exec", id}, argv...)...)
	if err != nil {
		e.t.Fatalf("in %.12s: %v", id, err)
	}
	return strings.TrimSpace(out)
}

// leftovers lists every container and volume on the daemon and every network but the daemon's
// own (host, none) and kloud's machine network.
func (e *dockerEnv) leftovers() []string {
	e.t.Helper()
	ctx := e.t.Context()
	var out []string
	cs, err := e.dd.Client.ContainerList(ctx, client.ContainerListOptions{All: true})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range cs.Items {
		out = append(out, "container "+c.ID[:12]+" "+strings.Join(c.Names, ","))
	}
	vs, err := e.dd.Client.VolumeList(ctx, client.VolumeListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, v := range vs.Items {
		out = append(out, "volume "+v.Name)
	}
	ns, err := e.dd.Client.NetworkList(ctx, client.NetworkListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, n := range ns.Items {
		if n.Name != "host" && n.Name != "none" && n.Name != e.network {
			out = append(out, "network "+n.Name)
		}
	}
	sort.Strings(out)
	return out
}

// containerID is the machine's container (the docker_container's id).
func containerID(m machine) string { s, _ := m.Attributes["id"].(string); return s }

// TestDockerStack builds a stack of two docker machines through the kloud CLI: both Running with
// their agents connected (the klient this kloud serves, installed by cloud-init from kloud's
// NoCloud seed), cloud-init's output log in place, labelled containers on kloud's network; a
// file written in one survives machine stop and start; destroy leaves no container, volume or
// network of the stack (docker ps -a, docker volume ls, docker network ls). On the way, the
// snapshot walk-through (snapshotRestoresFile) on the other machine.
func TestDockerStack(t *testing.T) {
	parallel(t)
	e := newDockerEnv(t)
	e.alice()
	tid := e.template(dockerTemplate("dev", 2))
	var created struct{ Stack struct{ ID string } }
	e.runJSON(&created, "stack", "create", "--template", tid)
	sid := created.Stack.ID
	t0 := time.Now()
	e.apply(sid)
	t.Logf("stack.apply of 2 docker machines: %s", time.Since(t0).Round(time.Millisecond))
	ms := e.machines(sid)
	for i := range 2 {
		label, hostname := fmt.Sprintf("dev.%d", i), fmt.Sprintf("dev-%d", i)
		m := ms[label]
		if m.State != "Running" || m.Agent.Status != "connected" || m.KiteID == "" {
			t.Fatalf("%s after apply: %+v", label, m)
		}
		if _, leak := m.Attributes["upload"]; leak {
			t.Errorf("%s: kloud stored the upload (the seed with the agent's key) in the machine's attributes", label)
		}
		id := containerID(m)
		res, err := e.dd.Client.ContainerInspect(t.Context(), id, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := res.Container
		if l := c.Config.Labels; l[docker.LabelStack] != sid || l[docker.LabelMachine] != m.ID || l[docker.LabelOwner] != "alice" || l[docker.LabelInstance] == "" {
			t.Errorf("%s: labels %v", label, l)
		}
		if !c.State.Running || string(c.HostConfig.NetworkMode) != e.network || c.HostConfig.Memory != 512<<20 || c.HostConfig.Privileged {
			t.Errorf("%s: running %v, network %s, memory %d, privileged %v", label, c.State.Running, c.HostConfig.NetworkMode, c.HostConfig.Memory, c.HostConfig.Privileged)
		}
		if got := e.exec(id, "hostname"); got != hostname {
			t.Errorf("%s: hostname %q, want %q", label, got, hostname)
		}
		if log := e.exec(id, "cat", userdata.CloudInitOutputPath); !strings.Contains(log, "Cloud-init v.") || !strings.Contains(log, "KLOUD-PROVISION step=done status=ok") {
			t.Errorf("%s: %s does not show cloud-init and the provisioning:\n%s", label, userdata.CloudInitOutputPath, log)
		}
		exes := strings.Fields(e.exec(id, "sh", "-c", `for p in /proc/[0-9]*; do readlink "$p/exe"; done; true`))
		if !slices.Contains(exes, userdata.KlientPath) {
			t.Errorf("%s: no process runs %s; executables: %q", label, userdata.KlientPath, exes)
		}
	}

	// stop/start keeps a file written inside.
	id0 := containerID(ms["dev.0"])
	e.stopStartKeepsFile(sid, "dev.0", func(argv ...string) string { return e.exec(id0, argv...) }, func(machine) {
		if res, err := e.dd.Client.ContainerInspect(t.Context(), id0, client.ContainerInspectOptions{}); err != nil || res.Container.State.Running {
			t.Fatalf("dev.0's container after stop: %v", err)
		}
	})

	// snapshot → write a file → restore → the file is gone, through kloud (machine.snapshot,
	// machine.restore of a running machine: stopped, saved or restored, started again).
	id1, t1 := containerID(ms["dev.1"]), time.Now()
	e.snapshotRestoresFile(sid, "dev.1", func(argv ...string) string { return e.exec(id1, argv...) }, func(snapID string) string {
		return filepath.Join(e.dir, "docker", "snapshots", snapID+".tar.zst")
	})
	t.Logf("snapshot, restore and delete through kloud: %s", time.Since(t1).Round(time.Millisecond))

	e.run("stack", "destroy", sid)
	if left := e.leftovers(); len(left) > 0 {
		t.Errorf("left on the daemon after destroy: %q", left)
	}
	var list []json.RawMessage
	e.runJSON(&list, "machine", "list", "--stack", sid)
	if len(list) != 0 {
		t.Errorf("machines after destroy: %s", list)
	}
}

// TestDockerKloudKilledMidBuild SIGKILLs kloud while a stack of docker machines builds
// (terraformer runs on its own, so it survives), while terraform runs and while kloud waits for
// the agents, and starts it again: the build resumes and ends with both machines Running (or
// fails saying why, no machine left Building), and destroy leaves nothing on the daemon.
func TestDockerKloudKilledMidBuild(t *testing.T) {
	parallel(t)
	for _, tc := range []struct {
		name    string
		percent int
	}{{"during terraform", 40}, {"while waiting for agents", 70}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newDockerEnv(t)
			e.alice()
			sid := e.createStack(e.template(dockerTemplate("k", 2)))
			_, j := e.killMidBuild(sid, tc.percent, 3*time.Minute)
			e.checkResumedBuild(sid, 2, j)
			e.run("stack", "destroy", sid)
			if left := e.leftovers(); len(left) > 0 {
				t.Errorf("left on the daemon after destroy: %q", left)
			}
		})
	}
}
