package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// TestPlanAndScaleSayWhatTheyDo (issue 18 §5): `stack plan` shows one line per machine with
// what the template sets (a script of several lines as "(N lines)"), and `stack scale` says it
// scales the resource from how many machines to how many, not "from revision 1 to 1". Real
// terraform, real agents (dummy machines run klient).
func TestPlanAndScaleSayWhatTheyDo(t *testing.T) {
	t.Parallel()
	testutil.RequireBinary(t, "curl")
	reg := provider.NewRegistry()
	machines := filepath.Join(t.TempDir(), "machines")
	reg.Register(dummy.New(dummy.Options{Dir: machines}))
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg, KlientBin: testutil.BuildBinary(t, "./cmd/klient")})
	t.Cleanup(func() { dummy.KillAll(context.Background(), machines) })
	e.StartTerraformerWith(tfrun.Options{Dir: filepath.Join(t.TempDir(), "terraformer")})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	alice := func(args ...string) (int, string, string) { return run(append(args, "--key", aliceKey)...) }
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))
	if _, err := e.Client("alice").CredentialAdd(t.Context(), api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"s3cret-token"}`)}); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(t.TempDir(), "main.tf")
	if err := os.WriteFile(main, []byte(`
resource "terraform_data" "web" {
  count = 2
  input = <<-EOT
    #!/bin/bash
    echo "web ${count.index}"
    echo "of $KLOUD_OWNER"
  EOT
  triggers_replace = "v1"
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var tmpl struct{ ID string }
	if err := json.Unmarshal([]byte(must(alice("template", "create", "--title", "web", "--file", main, "--json"))), &tmpl); err != nil || tmpl.ID == "" {
		t.Fatalf("template create: %+v %v", tmpl, err)
	}

	out := must(alice("stack", "plan", "--template", tmpl.ID))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "web.0 ") || !strings.HasPrefix(lines[2], "web.1 ") {
		t.Fatalf("stack plan: want a header and a line per machine:\n%s", out)
	}
	for _, l := range lines[1:] {
		if !strings.Contains(l, "input=(3 lines)") || !strings.Contains(l, "triggers_replace=v1") {
			t.Errorf("stack plan: the machine's line does not show what the template sets: %q", l)
		}
	}

	var created struct{ Stack struct{ ID string } }
	if err := json.Unmarshal([]byte(must(alice("stack", "create", "--template", tmpl.ID, "--json"))), &created); err != nil || created.Stack.ID == "" {
		t.Fatalf("stack create: %+v %v", created, err)
	}
	sid := created.Stack.ID
	t.Cleanup(func() { run("stack", "destroy", sid, "--key", aliceKey) })
	must(alice("stack", "apply", sid))

	out = must(alice("stack", "scale", sid, "web", "3"))
	if !strings.Contains(out, "scaling web from 2 to 3 machines") || regexp.MustCompile(`from revision \d+ to \d+`).MatchString(out) {
		t.Errorf("stack scale:\n%s", out)
	}
}

// TestDockerPlanShowsWhatTheTemplateSets (issue 18 §5): the docker provider's `stack plan` of
// the README's template lists the five attributes the template sets, not the ~30 defaults of
// docker_container, and its user data (a labels block of several lines) stays on the machine's
// line.
func TestDockerPlanShowsWhatTheTemplateSets(t *testing.T) {
	t.Parallel()
	dd := dockertest.New(t)
	subnet, release, err := sandbox.FreeSubnet(150)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	d, err := docker.New(docker.Options{Host: dd.Host, Image: dd.Image, Instance: "cliplan", Network: "kt-cliplan", Bridge: "kt-cliplan",
		Subnet: subnet, StateDir: t.TempDir(), Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	reg := provider.NewRegistry()
	reg.Register(d.Provider())
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg})
	e.StartTerraformerWith(tfrun.Options{Dir: filepath.Join(t.TempDir(), "terraformer")})
	main := filepath.Join(t.TempDir(), "main.tf")
	if err := os.WriteFile(main, []byte(`
terraform {
  required_providers {
    docker = { source = "kreuzwerker/docker", version = "4.6.0" }
  }
}

resource "docker_container" "dev" {
  count  = 2
  name   = "dev-${count.index}"
  image  = "kloud"
  memory = 1024
  cpus   = "1"
  labels {
    label = "kloud_user_data"
    value = <<-EOT
      #!/bin/sh
      echo "hello from dev-${count.index}" > /root/hello
    EOT
  }
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var tmpl struct{ ID string }
	if err := json.Unmarshal([]byte(must(run("template", "create", "--title", "docker", "--file", main, "--json"))), &tmpl); err != nil || tmpl.ID == "" {
		t.Fatalf("template create: %+v %v", tmpl, err)
	}
	out := must(run("stack", "plan", "--template", tmpl.ID))
	t.Logf("stack plan:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("stack plan: want a header and a line per machine:\n%s", out)
	}
	for i, l := range lines[1:] {
		want := fmt.Sprintf("dev.%d  docker  cpus=1 image=kloud labels=[{label=kloud_user_data, value=(2 lines)}] memory=1024 name=dev-%d", i, i)
		if strings.Join(strings.Fields(l), " ") != strings.Join(strings.Fields(want), " ") {
			t.Errorf("stack plan line %d:\n got %q\nwant %q", i+1, l, want)
		}
	}
}

// TestMachineInfoAttributes (issue 18 §5): `machine info` shows the machine's attributes one a
// line, kloud's tags (a JSON object in a string, as the state keeps them) as key=value pairs and
// a script as "(N lines)": no raw JSON, no line broken by a value.
func TestMachineInfoAttributes(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: filepath.Join(t.TempDir(), "machines")}))
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg})
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	must(run("key", "create", "--username", "alice", "--out", aliceKey))
	now := e.Server.Store().Now()
	m := model.Machine{ID: store.NewID(), Label: "vm.0", Resource: "vm", Provider: "dummy", Owner: "alice", Team: model.DefaultTeam,
		State: provider.Stopped, CreatedAt: now, UpdatedAt: now, StackID: store.NewID(), Attributes: map[string]any{
			"tags":      `{"kloud_machine":"m1","kloud_owner":"alice"}`,
			"user_data": "#!/bin/sh\necho hi\n",
			"cpus":      "1",
			"empty":     "",
		}}
	if err := e.Server.Store().Machines().InsertMany(t.Context(), []model.Machine{m}); err != nil {
		t.Fatal(err)
	}
	st := model.Stack{ID: m.StackID, Title: "tagged", Team: model.DefaultTeam, Owner: "alice", State: model.StackInitialized,
		Machines: []string{m.ID}, CreatedAt: now, UpdatedAt: now}
	if err := e.Server.Store().Stacks().Insert(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	out := must(run("machine", "info", m.ID, "--key", aliceKey))
	t.Logf("machine info:\n%s", out)
	if strings.Contains(out, `{"kloud_machine"`) || strings.Contains(out, "empty") {
		t.Errorf("machine info shows raw JSON or an empty attribute:\n%s", out)
	}
	for _, want := range []string{"tags       {kloud_machine=m1, kloud_owner=alice}", "user_data  (2 lines)", "cpus       1"} {
		if !strings.Contains(out, want) {
			t.Errorf("machine info: no %q in:\n%s", want, out)
		}
	}
}
