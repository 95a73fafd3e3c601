package docker_test

import (
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/e2e/providertest"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/bridgefw/bridgefwtest"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// The docker provider passes the conformance suite: containers on a private dockerd
// (dockertest: needs root, dockerd and the base image) built by real terraform in its sandbox
// through kloud's Docker API proxy, with real cloud-init and real klient agents. It skips loudly
// without them, and fails under CI=true.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance(t, dockertest.New(t))
}

// TestConformanceStockDockerd: the suite's FirewallEnforced case (with the Stack it needs, and
// Destroy) on a host with a stock dockerd: in a network namespace of the test's own where
// br_netfilter is on and FORWARD's policy is DROP (bridgefwtest), the machines run on a real
// dockerd that manages iptables. The owner's machines and the kloud host reach a machine through
// its agent's terminal, another user's does not until a rule opens the port.
func TestConformanceStockDockerd(t *testing.T) {
	t.Parallel()
	if !bridgefwtest.StockDockerHost(t, "Stack", "FirewallEnforced", "Destroy", "ResourcesGone") {
		return
	}
	conformance(t, dockertest.NewWith(t, dockertest.Options{IPTables: true}))
}

func conformance(t *testing.T, dd *dockertest.Daemon) {
	tf, cliConfig := Terraform(t)
	subnet, release, err := sandbox.FreeSubnet(150)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	gw := subnet.Addr().Next()
	// The Linux bridge's name is the host's, not the daemon's: one of its own, so that runs
	// of this test side by side (and their firewall tables, kloud-fw-<bridge>) do not meet.
	bridge := fmt.Sprintf("kconf%d", os.Getpid()%1000000)
	// kloud listens on the network's gateway, where the machines reach it (and terraform's
	// Docker provider reaches the proxy): the network first.
	pre, err := docker.New(docker.Options{Host: dd.Host, Image: dd.Image, Network: "kloud-conf", Bridge: bridge, Subnet: subnet, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := pre.EnsureNetwork(t.Context()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(gw.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d, err := docker.New(docker.Options{Host: dd.Host, Image: dd.Image, Network: "kloud-conf", Bridge: bridge, Subnet: subnet,
		Instance: "conformance", Endpoint: "http://" + addr, StateDir: t.TempDir(), Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	id := func(t *testing.T, m providertest.Machine) string {
		id, _ := m.Attributes["id"].(string)
		if id == "" {
			t.Fatalf("machine %s has no id attribute: %v", m.Label, m.Attributes)
		}
		return id
	}
	c := providertest.Config{
		Provider: d.Provider(),
		// cpus written plainly ("1", which the Docker provider reads back as "1.0") and memory
		// without memory_swap (which the daemon sets): kloud's ApplyTemplate writes both as they
		// read back (drift.go), so a stack update keeps machines whose template did not change
		// (the Update case).
		Template: func(n int) map[string]string {
			return map[string]string{"main.tf": fmt.Sprintf(`terraform {
  required_providers {
    docker = { source = "kreuzwerker/docker", version = "4.6.0" }
  }
}

resource "docker_container" "vm" {
  count  = %d
  name   = "vm-${count.index}"
  image  = "kloud"
  memory = 512
  cpus   = "1"
}
`, n)}
		},
		// The template's own user data (docker.UserDataLabel), an expression (count.index): kloud
		// takes each machine's planned value. The stack is built from this one, so the Update case
		// updates to it with another count; cpus and memory as above.
		UserScriptTemplate: func(n int, path, data string) map[string]string {
			return map[string]string{"main.tf": fmt.Sprintf(`terraform {
  required_providers {
    docker = { source = "kreuzwerker/docker", version = "4.6.0" }
  }
}

resource "docker_container" "vm" {
  count  = %d
  name   = "vm-${count.index}"
  image  = "kloud"
  memory = 512
  cpus   = "1"
  labels {
    label = "kloud_user_data"
    value = <<-EOT
      #!/bin/sh
      # machine ${count.index}
      printf '%%s\n' %q > /root/%s
    EOT
  }
}
`, n, data, path)}
		},
		// As kloud never would: the container stopped through the daemon directly.
		StopBehindBack: func(t *testing.T, m providertest.Machine) {
			if _, err := dd.Client.ContainerStop(t.Context(), id(t, m), client.ContainerStopOptions{}); err != nil {
				t.Fatalf("stop %s behind kloud's back: %v", m.Label, err)
			}
		},
		WriteFile: func(t *testing.T, m providertest.Machine, path, data string) {
			if out, err := dd.CLI(t.Context(), "exec", id(t, m), "sh", "-c", `printf %s "$1" > "/root/$2" && sync`, "sh", data, path); err != nil {
				t.Fatalf("in %s: %v: %s", m.Label, err, out)
			}
		},
		ReadFile: func(t *testing.T, m providertest.Machine, path string) string {
			out, err := dd.CLI(t.Context(), "exec", id(t, m), "cat", "/root/"+path)
			if err != nil {
				t.Fatalf("in %s: %v: %s", m.Label, err, out)
			}
			return out
		},
		Leftovers: func(t *testing.T) []string {
			var out []string
			cs, err := dd.Client.ContainerList(t.Context(), client.ContainerListOptions{All: true})
			if err != nil {
				t.Fatalf("list containers: %v", err)
			}
			for _, c := range cs.Items {
				out = append(out, strings.Join([]string{"container", c.ID[:12], strings.Join(c.Names, ","), c.Labels[docker.LabelMachine]}, " "))
			}
			vs, err := dd.Client.VolumeList(t.Context(), client.VolumeListOptions{})
			if err != nil {
				t.Fatalf("list volumes: %v", err)
			}
			for _, v := range vs.Items {
				out = append(out, "volume "+v.Name)
			}
			sort.Strings(out)
			return out
		},
		Terraform: tfrun.Options{TerraformPath: tf, CLIConfigFile: cliConfig},
	}
	c.Kloud.Addr = addr
	// UpdateKeepsPorts: cpus changed, which the provider applies by replacing the machine.
	c.ReplaceTemplate = func(n int) map[string]string {
		f := c.Template(n)
		f["main.tf"] = strings.Replace(f["main.tf"], `cpus   = "1"`, `cpus   = "0.5"`, 1)
		return f
	}
	providertest.Run(t, c)
}
