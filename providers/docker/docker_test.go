package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/userdata"
)

// Terraform returns terraform and the CLI config of the offline mirror, if the mirror has the
// Docker provider (scripts/build-docker-provider.sh); else the test is unavailable.
func Terraform(t testing.TB) (tf, cliConfig string) {
	t.Helper()
	tf, cliConfig = os.Getenv("TERRAFORM"), os.Getenv("TF_CLI_CONFIG_FILE")
	mirror := os.Getenv("TF_MIRROR")
	if tf == "" || cliConfig == "" || mirror == "" {
		testutil.Unavailable(t, "TERRAFORM, TF_CLI_CONFIG_FILE and TF_MIRROR are not set (source /var/cache/kloud/env)")
	}
	m, _ := filepath.Glob(filepath.Join(mirror, "registry.terraform.io/kreuzwerker/docker", docker.TerraformVersion, "*", "terraform-provider-docker_v*"))
	if len(m) == 0 {
		testutil.Unavailable(t, "the offline mirror %s has no kreuzwerker/docker %s (scripts/build-docker-provider.sh)", mirror, docker.TerraformVersion)
	}
	return tf, cliConfig
}

// fixture is a docker provider on a private daemon, its proxy served on loopback.
type fixture struct {
	d   *docker.Docker
	dd  *dockertest.Daemon
	url string
}

func newFixture(t *testing.T, instance string) *fixture { return newFixtureWith(t, instance, nil) }

// newFixtureWith is newFixture whose provider options opt may change before New.
func newFixtureWith(t *testing.T, instance string, opt func(*docker.Options, *dockertest.Daemon)) *fixture {
	return newFixtureOn(t, instance, dockertest.New(t), opt)
}

// newFixtureOn is newFixtureWith on daemon dd.
func newFixtureOn(t *testing.T, instance string, dd *dockertest.Daemon, opt func(*docker.Options, *dockertest.Daemon)) *fixture {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	subnet, release, err := sandbox.FreeSubnet(150)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	o := docker.Options{Host: dd.Host, Image: dd.Image, Instance: instance, Endpoint: url,
		StateDir: t.TempDir(), Logger: testutil.Logger(t),
		Network: "kt-" + instance, Bridge: "kt-" + instance, Subnet: subnet}
	if opt != nil {
		opt(&o, dd)
	}
	d, err := docker.New(o)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(provider.HandlerPrefix(docker.Name), d.Provider().Handler)
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	if err := d.Available(); err != nil {
		t.Fatal(err)
	}
	return &fixture{d: d, dd: dd, url: url}
}

// stackProxy applies a template of len(owners) machines m0, m1, ... (machine i owned by
// owners[i], the stack s1 by alice) and returns a Docker client of the proxy with the stack's
// token, as terraform gets it, and kloud's machine image. ApplyTemplate makes the network.
func (f *fixture) stackProxy(t *testing.T, owners []string) (*client.Client, string) {
	t.Helper()
	ctx := t.Context()
	var ms []*provider.MachineSpec
	for i, o := range owners {
		ms = append(ms, &provider.MachineSpec{ID: fmt.Sprintf("m%d", i), Label: fmt.Sprintf("vm.%d", i), Resource: "vm", Index: new(i), Provider: docker.Name, Owner: o})
	}
	src := fmt.Sprintf("resource \"docker_container\" \"vm\" {\n  count = %d\n  name  = \"vm-${count.index}\"\n  image = \"kloud\"\n}\n", len(owners))
	b := &provider.BaseStack{Provider: f.d.Provider(), StackID: "s1", Owner: "alice",
		Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(src)}}, Machines: ms, AgentConfig: agentConfig}
	st, _ := f.d.Provider().Stack(b)
	tpl, err := st.ApplyTemplate(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	image, err := f.d.EnsureImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := client.New(client.WithHost(tpl.Variables[docker.TokenVar].(string)), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc, image
}

// agentConfig is a well-formed agent configuration whose klient download fails (no kloud here:
// the conformance suite covers the agents); cloud-init still runs and logs.
func agentConfig(ctx context.Context, m *provider.MachineSpec) (userdata.Config, error) {
	return userdata.Config{Username: "alice", KiteKey: "a.b.c", KontrolURL: "http://127.0.0.1:1/kite",
		KlientURL: "http://127.0.0.1:1/dl/klient", KlientSHA256: strings.Repeat("0", 64)}, nil
}

func tfRun(t *testing.T, dir, tf, cliConfig string, args ...string) string {
	t.Helper()
	cmd := exec.Command(tf, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TF_CLI_CONFIG_FILE="+cliConfig, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("terraform %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeTemplate(t *testing.T, dir string, tpl *provider.Template) {
	for n, b := range tpl.Files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	vars, _ := json.Marshal(tpl.Variables)
	if err := os.WriteFile(filepath.Join(dir, "terraform.tfvars.json"), vars, 0o600); err != nil {
		t.Fatal(err)
	}
}

const twoMachines = `terraform {
  required_providers {
    docker = { source = "kreuzwerker/docker", version = "4.6.0" }
  }
}

provider "docker" {}

resource "docker_container" "vm" {
  count  = 2
  name   = "vm-${count.index}"
  image  = "kloud"
  memory = 256
  cpus   = "0.5"
  labels {
    label = "kloud_user_data"
    value = "#!/bin/sh\necho hello from the template\n"
  }
}
`

// The provider end to end without kloud: ApplyTemplate's template applied by real terraform
// through the proxy to a private dockerd; the containers boot cloud-init from kloud's seed, are
// labelled, limited and on kloud's network; stop and start keep the writable layer; the proxy
// refuses what the template may not do; destroy leaves no container.
func TestMachinesThroughTerraform(t *testing.T) {
	t.Parallel()
	tf, cliConfig := Terraform(t)
	f := newFixture(t, "t1")
	ctx := t.Context()
	cli := f.dd.Client
	ms := []*provider.MachineSpec{
		{ID: "m0", Label: "vm.0", Resource: "vm", Index: new(0), Provider: docker.Name, Owner: "alice"},
		{ID: "m1", Label: "vm.1", Resource: "vm", Index: new(1), Provider: docker.Name, Owner: "alice"},
	}
	b := &provider.BaseStack{Provider: f.d.Provider(), StackID: "s1", Owner: "alice", Team: "team1",
		Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(twoMachines)}}, Machines: ms, AgentConfig: agentConfig}
	st, _ := f.d.Provider().Stack(b)
	tpl, err := st.ApplyTemplate(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeTemplate(t, dir, tpl)
	tfRun(t, dir, tf, cliConfig, "init", "-input=false", "-no-color")
	t0 := time.Now()
	tfRun(t, dir, tf, cliConfig, "apply", "-input=false", "-no-color", "-auto-approve")
	t.Logf("apply: %s", time.Since(t0).Round(time.Millisecond))

	out := tfRun(t, dir, tf, cliConfig, "show", "-json")
	var state struct {
		Values struct {
			RootModule struct {
				Resources []struct {
					Index  any            `json:"index"`
					Values map[string]any `json:"values"`
				} `json:"resources"`
			} `json:"root_module"`
		} `json:"values"`
	}
	if err := json.Unmarshal([]byte(out), &state); err != nil {
		t.Fatal(err)
	}
	if n := len(state.Values.RootModule.Resources); n != 2 {
		t.Fatalf("%d resources in the state", n)
	}
	var machines []provider.Machine
	for i, r := range state.Values.RootModule.Resources {
		id, _ := r.Values["id"].(string)
		res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := res.Container
		lbl := c.Config.Labels
		if lbl[docker.LabelStack] != "s1" || lbl[docker.LabelMachine] != ms[i].ID || lbl[docker.LabelOwner] != "alice" || lbl[docker.LabelTeam] != "team1" || lbl[docker.LabelInstance] != "t1" {
			t.Errorf("container %d labels %v", i, lbl)
		}
		if _, ok := lbl[docker.UserDataLabel]; ok {
			t.Errorf("container %d carries the template's user data as a label: %v", i, lbl)
		}
		if c.HostConfig.Memory != 256<<20 || c.HostConfig.NanoCPUs != 5e8 || c.HostConfig.Privileged || string(c.HostConfig.NetworkMode) != f.d.Network() {
			t.Errorf("container %d: memory %d, nanocpus %d, privileged %v, network %s", i, c.HostConfig.Memory, c.HostConfig.NanoCPUs, c.HostConfig.Privileged, c.HostConfig.NetworkMode)
		}
		if c.Config.Hostname != "vm-"+string(rune('0'+i)) {
			t.Errorf("container %d hostname %q", i, c.Config.Hostname)
		}
		m, err := f.d.Provider().Machine(&provider.BaseMachine{ID: ms[i].ID, Label: ms[i].Label, StackID: "s1", Attributes: r.Values})
		if err != nil {
			t.Fatal(err)
		}
		machines = append(machines, m)
	}
	exec := func(m int, argv ...string) (string, error) {
		id := state.Values.RootModule.Resources[m].Values["id"].(string)
		return f.dd.CLI(ctx, append([]string{"exec", id}, argv...)...)
	}
	// cloud-init ran kloud's user data from the seed: its final stage runs kloud's provisioning,
	// which tries to download klient (there is no kloud here: it retries; the conformance suite
	// has the agents).
	var log string
	testutil.Eventually(t, 90*time.Second, func() bool {
		log, _ = machines[0].(provider.ConsoleLogger).ConsoleLog(ctx)
		return strings.Contains(log, "kloud-provision: download attempt")
	}, "cloud-init did not run kloud's provisioning in machine 0")
	if !strings.Contains(log, "modules:final") || !strings.Contains(log, "kloud-boot: cloud-init init --local") {
		t.Errorf("console log without the boot script's and cloud-init's final stage:\n%s", log)
	}
	// The stages before the final one ended, in one Python process (userdata.CloudInitStages),
	// which gave cloud-init libyaml's parser and spawned the stages' tee without a fork of python.
	if !strings.Contains(log, "kloud-boot: cloud-init modules --mode=config: exit 0") || strings.Contains(log, "cannot import cloud-init") ||
		!strings.Contains(log, "kloud-boot: cloud-init's YAML parser: libyaml") ||
		!strings.Contains(log, "kloud-boot: cloud-init's output: tee spawned without a fork of python") {
		t.Errorf("cloud-init's stages did not run in one process:\n%s", log)
	}
	if out, err := exec(0, "test", "-s", "/var/log/cloud-init-output.log"); err != nil {
		t.Errorf("no /var/log/cloud-init-output.log: %v %s", err, out)
	}
	if out, err := exec(0, "cloud-init", "query", "ds"); err != nil || !strings.Contains(out, "nocloud") && !strings.Contains(strings.ToLower(out), "nocloud") {
		t.Logf("cloud-init query ds: %v %s", err, out)
	}
	if out, err := exec(0, "id", "alice"); err != nil {
		t.Errorf("the owner's account was not made by cloud-init: %v %s", err, out)
	}
	// The template's own user data reached the seed, merged with kloud's: cloud-init wrote the
	// user script (provision.sh runs it once klient is up, which needs kloud: the conformance
	// suite checks that it ran).
	if out, err := exec(0, "cat", "/var/lib/kloud/user-script.sh"); err != nil || !strings.Contains(out, "echo hello from the template") {
		t.Errorf("the template's user script is not in the machine: %v %q", err, out)
	}
	// Info, stop/start keeping a file.
	if s, meta, err := machines[0].Info(ctx); err != nil || s != provider.Running || meta.(map[string]any)["ip_address"] == nil {
		t.Fatalf("info: %v %v %v", s, meta, err)
	}
	if _, err := exec(0, "sh", "-c", "echo kept > /root/file && sync"); err != nil {
		t.Fatal(err)
	}
	if _, err := machines[0].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _, err := machines[0].Info(ctx); err != nil || s != provider.Stopped {
		t.Fatalf("info after stop: %v %v", s, err)
	}
	if _, err := machines[0].Start(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _, err := machines[0].Info(ctx); err != nil || s != provider.Running {
		t.Fatalf("info after start: %v %v", s, err)
	}
	if out, err := exec(0, "cat", "/root/file"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Errorf("file after stop/start: %q %v", out, err)
	}

	// The proxy with this stack's token: no privileged container, no other stack's container.
	host := tpl.Variables[docker.TokenVar].(string)
	pc, err := client.New(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	_, err = pc.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: f.dd.Image, Entrypoint: []string{docker.BootPath},
			Labels: map[string]string{docker.LabelStack: "s1", docker.LabelMachine: "m0", docker.LabelInstance: "t1"}},
		HostConfig: &container.HostConfig{Privileged: true, NetworkMode: container.NetworkMode(f.d.Network()), Binds: []string{"/:/host"}},
	})
	if err == nil || !strings.Contains(err.Error(), "HostConfig.Binds, HostConfig.Privileged") {
		t.Errorf("privileged create through the proxy: %v", err)
	}
	other, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{Image: f.dd.Image, Entrypoint: []string{"true"}}, Name: "not-kloud"})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := pc.ContainerList(ctx, client.ContainerListOptions{All: true}); err != nil || len(l.Items) != 2 {
		t.Errorf("container list through the proxy: %v, want the stack's 2 containers only", err)
	} else {
		for _, c := range l.Items {
			if c.ID == other.ID {
				t.Error("container list through the proxy shows a container that is not the stack's")
			}
		}
	}
	if _, err := pc.Info(ctx, client.InfoOptions{}); err == nil {
		t.Error("GET /info through the proxy was allowed")
	}
	if _, err := pc.ContainerRemove(ctx, other.ID, client.ContainerRemoveOptions{Force: true}); err == nil {
		t.Error("the proxy removed a container that is not the stack's")
	}
	cli.ContainerRemove(ctx, other.ID, client.ContainerRemoveOptions{Force: true})

	tfRun(t, dir, tf, cliConfig, "destroy", "-input=false", "-no-color", "-auto-approve")
	left, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Errorf("destroy left %d containers", len(left.Items))
	}
	vols, err := cli.VolumeList(ctx, client.VolumeListOptions{})
	if err != nil || len(vols.Items) != 0 {
		t.Errorf("volumes left: %v %v", vols.Items, err)
	}
	if s, _, err := machines[0].Info(ctx); err != nil || s != provider.Terminated {
		t.Errorf("info after destroy: %v %v", s, err)
	}

	// The startup sweep removes this instance's containers of dead stacks only.
	mk := func(name string, labels map[string]string) string {
		c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name, Config: &container.Config{Image: f.dd.Image, Entrypoint: []string{"true"}, Labels: labels}})
		if err != nil {
			t.Fatal(err)
		}
		return c.ID
	}
	dead := mk("dead", map[string]string{docker.LabelInstance: "t1", docker.LabelStack: "gone", docker.LabelMachine: "m9"})
	alive := mk("alive", map[string]string{docker.LabelInstance: "t1", docker.LabelStack: "s1", docker.LabelMachine: "m0"})
	otherInst := mk("other", map[string]string{docker.LabelInstance: "t2", docker.LabelStack: "gone", docker.LabelMachine: "m9"})
	plain := mk("plain", nil)
	// The inventory (capability resources, kloud gc) lists this instance's labelled containers
	// only, with kloud's tags, and removes only this instance's.
	rs, err := f.d.Provider().Inventory.Resources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]provider.Resource{}
	for _, r := range rs {
		listed[r.ID] = r
	}
	if len(rs) != 2 || listed[dead].Tag(provider.TagStack) != "gone" || listed[alive].Tag(provider.TagMachine) != "m0" ||
		listed[alive].Tag(provider.TagInstance) != "t1" || listed[alive].Name != "alive" || listed[alive].CreatedAt.IsZero() {
		t.Errorf("Resources: %+v, want containers dead and alive with kloud's tags", rs)
	}
	foreign := provider.Resource{ID: otherInst, Kind: docker.KindContainer, Tags: provider.ResourceTags("gone", "", "", "m9", "t1")}
	if err := f.d.Provider().Inventory.RemoveResource(ctx, foreign); err == nil {
		t.Errorf("RemoveResource of another instance's container: no error")
	}
	gone, err := f.d.GC(ctx, func(stack, machine string) bool { return stack == "s1" })
	if err != nil || len(gone) != 1 || gone[0] != dead {
		t.Errorf("GC removed %v (%v), want only %s", gone, err, dead)
	}
	for _, id := range []string{alive, otherInst, plain} {
		if _, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err != nil {
			t.Errorf("GC removed a container it must keep: %v", err)
		}
		cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true})
	}
	if err := f.d.RemoveNetwork(ctx); err != nil {
		t.Error(err)
	}
}
