package local_test

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/e2e/providertest"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// The local provider passes the conformance suite: real namespace machines with real cloud-init
// on a private bridge, subnet and state dir (tfprovidertest.NewHost, which needs root and the
// base image: it skips loudly without them, and fails under CI=true).
func TestConformance(t *testing.T) {
	h := tfprovidertest.NewHost(t)
	tf, cliConfig := tfprovidertest.Terraform(t)
	// kloud listens on the bridge address, where the machines reach it (and terraform's
	// kloudlocal provider reaches its machine service).
	if err := h.Manager.SetupNetwork(t.Context()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(h.HostAddr().String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	l, err := local.New(local.Options{
		StateDir: h.StateDir, BaseImage: h.BaseImage, Bridge: h.Bridge, Subnet: h.Subnet, Logger: testutil.Logger(t),
		Instance: "conformance", Endpoint: "http://" + addr,
	})
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
	exec := func(t *testing.T, m providertest.Machine, argv ...string) string {
		out, err := h.Manager.Exec(t.Context(), id(t, m), argv...)
		if err != nil {
			t.Fatalf("in %s: %v: %s", m.Label, err, out)
		}
		return string(out)
	}
	c := providertest.Config{
		Provider: l.Provider(),
		Template: func(n int) map[string]string {
			return map[string]string{"main.tf": fmt.Sprintf(`terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

resource "kloudlocal_machine" "vm" {
  count     = %d
  hostname  = "vm-${count.index}"
  memory    = 512
  user_data = <<-EOT
    #!/bin/bash
    echo "hello from $(hostname)"
  EOT
}
`, n)}
		},
		// As `kloud` never would: the machine stopped through the sandbox library directly.
		StopBehindBack: func(t *testing.T, m providertest.Machine) {
			if _, err := h.Manager.Stop(t.Context(), id(t, m)); err != nil {
				t.Fatalf("stop %s behind kloud's back: %v", m.Label, err)
			}
		},
		WriteFile: func(t *testing.T, m providertest.Machine, path, data string) {
			exec(t, m, "sh", "-c", `printf %s "$1" > "/root/$2" && sync`, "sh", data, path)
		},
		ReadFile: func(t *testing.T, m providertest.Machine, path string) string {
			return exec(t, m, "cat", "/root/"+path)
		},
		Leftovers: func(t *testing.T) []string {
			ms, err := h.Manager.List(t.Context())
			if err != nil {
				t.Fatalf("list machines: %v", err)
			}
			var out []string
			for _, m := range ms {
				out = append(out, strings.Join([]string{"machine", m.ID, m.Hostname}, " "))
			}
			los, err := h.Manager.Leftovers(t.Context())
			if err != nil {
				t.Fatalf("list leftovers: %v", err)
			}
			for _, lo := range los {
				out = append(out, "leftovers of machine "+lo.ID+": "+lo.Parts())
			}
			return out
		},
		Terraform: tfrun.Options{TerraformPath: tf, CLIConfigFile: cliConfig},
	}
	c.Kloud.Addr = addr
	// UpdateKeepsPorts: memory changed, which the provider applies by replacing the machine.
	c.ReplaceTemplate = func(n int) map[string]string {
		f := c.Template(n)
		f["main.tf"] = strings.Replace(f["main.tf"], `memory    = 512`, `memory    = 384`, 1)
		return f
	}
	providertest.Run(t, c)
}
