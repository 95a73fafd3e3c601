package docker_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/providers/docker"
)

// The Terraform surface the docker provider offers templates is docker_container and nothing
// else of kreuzwerker/docker: no other resource or data source (images, volumes, networks,
// plugins, registry images, docker_logs, ...), and no provider block arguments (host,
// registry_auth, ssh_opts, cert paths: kloud writes the block).
func TestTemplatePolicy(t *testing.T) {
	t.Parallel()
	d, err := docker.New(docker.Options{Host: "unix:///nonexistent.sock", Image: "i", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	reg := provider.NewRegistry()
	reg.Register(d.Provider())
	pol := reg.TemplatePolicy()
	check := func(src string) error {
		c, err := tmpl.Parse(map[string][]byte{"main.tf": []byte(src)})
		if err != nil {
			t.Fatal(err)
		}
		return c.CheckPolicy(pol)
	}
	req := `terraform {
  required_providers {
    docker = { source = "kreuzwerker/docker", version = "4.6.0" }
  }
}
`
	if err := check(req + `provider "docker" {}
resource "docker_container" "vm" {
  name  = "vm"
  image = "kloud"
}
`); err != nil {
		t.Fatalf("a docker machine: %v", err)
	}
	for name, src := range map[string]string{
		"provider host":      `provider "docker" { host = "unix:///var/run/docker.sock" }`,
		"registry auth":      "provider \"docker\" {\n  registry_auth {\n    address = \"x\"\n    config_file = \"/root/.docker/config.json\"\n  }\n}",
		"image resource":     `resource "docker_image" "i" { name = "alpine" }`,
		"volume":             `resource "docker_volume" "v" { name = "v" }`,
		"network":            `resource "docker_network" "n" { name = "n" }`,
		"plugin":             `resource "docker_plugin" "p" { name = "p" }`,
		"image data source":  `data "docker_image" "i" { name = "alpine" }`,
		"logs data source":   `data "docker_logs" "l" { name = "x" }`,
		"network data":       `data "docker_network" "n" { name = "host" }`,
		"registry image":     `resource "docker_registry_image" "r" { name = "x" }`,
		"other source":       "terraform {\n  required_providers {\n    docker = { source = \"evil/docker\" }\n  }\n}",
		"local-exec":         "resource \"docker_container\" \"vm\" {\n  name = \"vm\"\n  image = \"k\"\n  provisioner \"local-exec\" { command = \"id\" }\n}",
		"file() into upload": "resource \"docker_container\" \"vm\" {\n  name = \"vm\"\n  image = \"k\"\n  env = [file(\"/etc/shadow\")]\n}",
	} {
		if err := check(req + src + "\n"); err == nil {
			t.Errorf("%s: allowed by the template policy", name)
		}
	}
}

// ApplyTemplate refuses a hostile docker_container before anything else, naming file and line
// (CheckTemplate; check_test.go has one case per argument).
func TestApplyTemplateRefusesHostile(t *testing.T) {
	t.Parallel()
	d, err := docker.New(docker.Options{Host: "unix:///nonexistent.sock", Image: "i", StateDir: t.TempDir(), Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	src := `resource "docker_container" "vm" {
  name       = "vm"
  image      = "kloud"
  privileged = true
  mounts {
    type   = "bind"
    source = "/var/run/docker.sock"
    target = "/var/run/docker.sock"
  }
}
`
	b := &provider.BaseStack{Provider: d.Provider(), StackID: "s", Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(src)}},
		Machines: []*provider.MachineSpec{{ID: "m", Label: "vm", Resource: "vm", Provider: docker.Name}}}
	st, _ := d.Provider().Stack(b)
	_, err = st.ApplyTemplate(t.Context(), nil)
	if err == nil || !strings.Contains(err.Error(), "main.tf:4: docker_container.vm: privileged is not allowed") || !strings.Contains(err.Error(), "main.tf:5: docker_container.vm: mounts is not allowed") {
		t.Fatalf("ApplyTemplate: %v", err)
	}
	// Planned values are checked too (an argument CheckTemplate cannot see, e.g. from a module
	// a trusted template may use).
	b.Template.Files["main.tf"] = []byte("resource \"docker_container\" \"vm\" {\n  name = \"vm\"\n  image = \"kloud\"\n}\n")
	b.Machines[0].Attributes = map[string]any{"privileged": true, "volumes": []any{map[string]any{"host_path": "/"}}}
	st, _ = d.Provider().Stack(b)
	if _, err := st.ApplyTemplate(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "privileged, volumes may not be set") {
		t.Fatalf("ApplyTemplate with hostile planned values: %v", err)
	}
}
