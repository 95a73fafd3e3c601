package vagrant_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/e2e/providertest"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kontrol/kontroltest"
	"github.com/kloud-dev/kloud/providers/vagrant"
	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/providers/vagrant/vagranttest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// The vagrant provider passes the conformance suite: the suite's user's own vagrant host (a real
// klient --vagrant driving the real vagrant with its docker provider, against a private dockerd)
// builds the machines; their agents come from cloud-init and register with the suite's kloud.
//
// The host klient registers with a kontrol of its own (kontroltest) and the provider reaches it
// through KontrolHosts of that kontrol: the suite starts its kloud itself, after the provider is
// registered, so the host cannot use the suite kloud's kontrol. kloud serve passes its own
// (serve_vagrant.go); the e2e test covers that wiring.
func TestConformance(t *testing.T) {
	const user = "conformance" // providertest's user
	ko := kontroltest.Start(t, kontroltest.Options{})
	keyFile, _ := ko.KeyFile(user)
	host := vagranttest.Start(t, ko.URL(), keyFile)
	tf, cliConfig := tfprovidertest.Terraform(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	state := t.TempDir()
	v, err := vagrant.New(vagrant.Options{
		StateDir: state, Hosts: vagrant.KontrolHosts(ko.Kontrol), Instance: "conformance",
		Endpoint: "http://" + addr, Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	container := func(t *testing.T, m providertest.Machine) string {
		name, _ := m.Attributes["id"].(string)
		b, err := os.ReadFile(filepath.Join(host.Home, "machines", name, ".vagrant", "machines", "default", "docker", "id"))
		if err != nil {
			t.Fatalf("machine %s (%q): no container: %v", m.Label, name, err)
		}
		return strings.TrimSpace(string(b))
	}
	docker := func(t *testing.T, args ...string) string {
		cmd := exec.Command("docker", args...)
		cmd.Env = append(os.Environ(), host.Dockerd.Env())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("docker %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	c := providertest.Config{
		Provider: v.Provider(),
		Template: func(n int) map[string]string {
			return map[string]string{"main.tf": fmt.Sprintf(`terraform {
  required_providers {
    kloudvagrant = { source = "kloud/kloudvagrant" }
  }
}

resource "kloudvagrant_machine" "vm" {
  count     = %d
  hostname  = "vm-${count.index}"
  image     = %q
  memory    = 512
  user_data = <<-EOT
    #!/bin/bash
    echo "hello from $(hostname)"
  EOT
}
`, n, vagranttest.Image)}
		},
		// As kloud never would: the container stopped with docker, around Vagrant and the host klient.
		StopBehindBack: func(t *testing.T, m providertest.Machine) { docker(t, "stop", container(t, m)) },
		WriteFile: func(t *testing.T, m providertest.Machine, path, data string) {
			docker(t, "exec", container(t, m), "sh", "-c", `printf %s "$1" > "/root/$2" && sync`, "sh", data, path)
		},
		ReadFile: func(t *testing.T, m providertest.Machine, path string) string {
			return docker(t, "exec", container(t, m), "cat", "/root/"+path)
		},
		// Containers, the host's machine directories and kloud's records of them.
		Leftovers: func(t *testing.T) []string {
			var out []string
			for _, c := range host.Dockerd.Containers(t) {
				out = append(out, "container "+c)
			}
			for _, dir := range []string{filepath.Join(host.Home, "machines"), filepath.Join(state, "machines")} {
				ents, _ := os.ReadDir(dir)
				for _, e := range ents {
					out = append(out, filepath.Join(dir, e.Name()))
				}
			}
			return out
		},
		Terraform: tfrun.Options{TerraformPath: tf, CLIConfigFile: cliConfig},
	}
	c.Kloud.Addr = addr
	providertest.Run(t, c)
}
