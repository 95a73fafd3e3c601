package docker_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/docker"
)

// driftTemplate: one machine with literal limits (cpus written as "1", which the Docker provider
// reads back as "1.0"; no memory_swap, which the daemon sets) and one whose limits are
// expressions (kloud takes the planned values).
func driftTemplate(memory int) string {
	return `terraform {
  required_providers {
    docker = { source = "kreuzwerker/docker", version = "4.6.0" }
  }
}

variable "w_cpus" {
  default = 2
}

variable "w_memory" {
  default = 128
}

resource "docker_container" "vm" {
  name   = "vm"
  image  = "kloud"
  memory = ` + strconv.Itoa(memory) + `
  cpus   = "1"
}

resource "docker_container" "w" {
  name   = "w"
  image  = "kloud"
  memory = var.w_memory
  cpus   = var.w_cpus
}
`
}

// planExit runs terraform plan -detailed-exitcode: 0 no changes, 2 changes (anything else fails).
func planExit(t *testing.T, dir, tf, cliConfig string) (int, string) {
	t.Helper()
	cmd := exec.Command(tf, "plan", "-input=false", "-no-color", "-detailed-exitcode")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TF_CLI_CONFIG_FILE="+cliConfig, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee) && ee.ExitCode() == 2:
		return 2, string(out)
	}
	t.Fatalf("terraform plan: %v\n%s", err, out)
	return 0, ""
}

// Issue 12's drift, for real: a template with cpus = "1" and no memory_swap applied by real
// terraform through kloud's proxy plans again with no changes; a memory change is an in-place
// update through the proxy (same container, a file written inside survives) after which the plan
// is empty again; the proxy refuses updates of another stack's container, of anything but the
// resource limits, of the restart policy, beyond the daemon's limits, and with a token that lists
// no machines.
func TestTemplatesDoNotDrift(t *testing.T) {
	t.Parallel()
	tf, cliConfig := Terraform(t)
	f := newFixture(t, "dr")
	ctx := t.Context()
	cli := f.dd.Client
	specs := func() []*provider.MachineSpec {
		return []*provider.MachineSpec{
			{ID: "m0", Label: "vm", Resource: "vm", Provider: docker.Name, Owner: "alice"},
			// As kloud plans it: the expressions' values.
			{ID: "m1", Label: "w", Resource: "w", Provider: docker.Name, Owner: "alice", Attributes: map[string]any{"cpus": "2", "memory": float64(128)}},
		}
	}
	render := func(src string, ms []*provider.MachineSpec) *provider.Template {
		b := &provider.BaseStack{Provider: f.d.Provider(), StackID: "s1", Owner: "alice", Team: "team1",
			Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(src)}}, Machines: ms, AgentConfig: agentConfig}
		st, _ := f.d.Provider().Stack(b)
		tpl, err := st.ApplyTemplate(context.WithoutCancel(ctx), nil) // also in the cleanup
		if err != nil {
			t.Fatal(err)
		}
		return tpl
	}
	dir := t.TempDir()
	writeTemplate(t, dir, render(driftTemplate(256), specs()))
	tfRun(t, dir, tf, cliConfig, "init", "-input=false", "-no-color")
	tfRun(t, dir, tf, cliConfig, "apply", "-input=false", "-no-color", "-auto-approve")
	t.Cleanup(func() {
		writeTemplate(t, dir, render(driftTemplate(512), nil))
		tfRun(t, dir, tf, cliConfig, "destroy", "-input=false", "-no-color", "-auto-approve")
		if left := f.dd.Containers(t); len(left) != 0 {
			t.Errorf("destroy left containers: %v", left)
		}
		if err := f.d.RemoveNetwork(context.Background()); err != nil { // t.Context() is done by now
			t.Error(err)
		}
	})
	inspect := func(name string) container.InspectResponse {
		t.Helper()
		res, err := cli.ContainerInspect(ctx, "kloud-"+name, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Container
	}
	vm, w := inspect("m0"), inspect("m1")
	if vm.HostConfig.NanoCPUs != 1e9 || vm.HostConfig.Memory != 256<<20 || vm.HostConfig.MemorySwap != 512<<20 {
		t.Errorf("vm: nanocpus %d memory %d swap %d, want 1 CPU, 256 MB, Docker's default swap 512 MB", vm.HostConfig.NanoCPUs, vm.HostConfig.Memory, vm.HostConfig.MemorySwap)
	}
	if w.HostConfig.NanoCPUs != 2e9 || w.HostConfig.Memory != 128<<20 {
		t.Errorf("w: nanocpus %d memory %d, want 2 CPUs, 128 MB", w.HostConfig.NanoCPUs, w.HostConfig.Memory)
	}
	if code, out := planExit(t, dir, tf, cliConfig); code != 0 {
		t.Fatalf("the plan right after apply has changes (drift):\n%s", out)
	}
	if out, err := f.dd.CLI(ctx, "exec", vm.ID, "sh", "-c", "echo kept > /root/kept && sync"); err != nil {
		t.Fatalf("write a file in vm: %v %s", err, out)
	}

	// memory 256 → 512: an in-place update through the proxy.
	tpl := render(driftTemplate(512), specs())
	writeTemplate(t, dir, tpl)
	code, out := planExit(t, dir, tf, cliConfig)
	if code != 2 || !strings.Contains(out, "0 to add, 1 to change, 0 to destroy") || strings.Contains(out, "forces replacement") {
		t.Fatalf("plan of the memory change: want one in-place update:\n%s", out)
	}
	tfRun(t, dir, tf, cliConfig, "apply", "-input=false", "-no-color", "-auto-approve")
	vm2 := inspect("m0")
	if vm2.ID != vm.ID || vm2.HostConfig.Memory != 512<<20 || vm2.HostConfig.MemorySwap != 1024<<20 || vm2.HostConfig.NanoCPUs != 1e9 {
		t.Errorf("after the update: id %s (was %s), memory %d, swap %d, nanocpus %d", vm2.ID[:12], vm.ID[:12], vm2.HostConfig.Memory, vm2.HostConfig.MemorySwap, vm2.HostConfig.NanoCPUs)
	}
	if out, err := f.dd.CLI(ctx, "exec", vm.ID, "cat", "/root/kept"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Errorf("the file written before the update: %q %v", out, err)
	}
	if code, out := planExit(t, dir, tf, cliConfig); code != 0 {
		t.Errorf("the plan after the update has changes:\n%s", out)
	}

	// The proxy, with this build's token.
	pc, err := client.New(client.WithHost(tpl.Variables[docker.TokenVar].(string)), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	update := func(id string, uc container.UpdateConfig) error {
		_, err := pc.ContainerUpdate(ctx, id, client.ContainerUpdateOptions{Resources: &uc.Resources, RestartPolicy: &uc.RestartPolicy})
		return err
	}
	if err := update(vm.ID, container.UpdateConfig{Resources: container.Resources{Memory: 384 << 20, MemorySwap: 768 << 20}, RestartPolicy: container.RestartPolicy{Name: "no"}}); err != nil {
		t.Errorf("an update of the limits: %v", err)
	}
	other, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: "other-stack",
		Config: &container.Config{Image: f.dd.Image, Entrypoint: []string{"true"}, Labels: map[string]string{docker.LabelInstance: "dr", docker.LabelStack: "s2", docker.LabelMachine: "m0"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.ContainerRemove(ctx, other.ID, client.ContainerRemoveOptions{Force: true})
	pids := int64(10)
	refused := []struct {
		name, id, want string
		uc             container.UpdateConfig
	}{
		{"another stack's container", other.ID, "no such container", container.UpdateConfig{Resources: container.Resources{Memory: 64 << 20}}},
		{"a container by a name that is not kloud's", "other-stack", "no such container", container.UpdateConfig{Resources: container.Resources{Memory: 64 << 20}}},
		{"the restart policy", vm.ID, "restart policy", container.UpdateConfig{RestartPolicy: container.RestartPolicy{Name: "always"}}},
		{"the block IO weight", vm.ID, "BlkioWeight", container.UpdateConfig{Resources: container.Resources{BlkioWeight: 10}}},
		{"the pids limit", vm.ID, "PidsLimit", container.UpdateConfig{Resources: container.Resources{PidsLimit: &pids}}},
		{"the cgroup parent", vm.ID, "CgroupParent", container.UpdateConfig{Resources: container.Resources{CgroupParent: "/"}}},
		{"memory beyond the daemon's", vm.ID, "mem (memory)", container.UpdateConfig{Resources: container.Resources{Memory: 1 << 50}}},
		{"cpus beyond the daemon's", vm.ID, "cores (cpus)", container.UpdateConfig{Resources: container.Resources{NanoCPUs: 1e12}}},
	}
	for _, c := range refused {
		err := update(c.id, c.uc)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("update of %s through the proxy: %v, want an error naming %q", c.name, err, c.want)
		}
	}
	// A huge body is refused before it is parsed.
	base := "http://" + strings.TrimPrefix(tpl.Variables[docker.TokenVar].(string), "tcp://")
	resp, err := http.Post(base+"/containers/"+vm.ID+"/update", "application/json", strings.NewReader(`{"Memory":`+strings.Repeat(" ", 2<<20)+`1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a 2 MB update body: status %d, want 413", resp.StatusCode)
	}
	// Keys the daemon's decoder would also take (it matches names case-insensitively, the last
	// one winning) are refused, not passed on.
	for _, body := range []string{`{"RestartPolicy":{"Name":"no","name":"always"}}`, `{"Memory":67108864,"memory":1125899906842624}`, `{"restartpolicy":{"Name":"always"}}`} {
		resp, err := http.Post(base+"/containers/"+vm.ID+"/update", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			t.Errorf("update %s: status %d, want a refusal", body, resp.StatusCode)
		}
	}
	if got := inspect("m0"); got.HostConfig.RestartPolicy.Name != "no" || got.HostConfig.Memory != 384<<20 || got.HostConfig.PidsLimit != nil && *got.HostConfig.PidsLimit == 10 {
		t.Errorf("a refused update changed the container: restart %q memory %d", got.HostConfig.RestartPolicy.Name, got.HostConfig.Memory)
	}
	// A destroy's token lists no machines: it updates nothing.
	dtpl := render(driftTemplate(512), nil)
	dc, err := client.New(client.WithHost(dtpl.Variables[docker.TokenVar].(string)), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if _, err := dc.ContainerUpdate(ctx, vm.ID, client.ContainerUpdateOptions{Resources: &container.Resources{Memory: 256 << 20}}); err == nil || !strings.Contains(err.Error(), "not one this build may change") {
		t.Errorf("update with a token without machines: %v", err)
	}
}
