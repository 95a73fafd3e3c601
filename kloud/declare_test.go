package kloud_test

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// A template of local machines that leaves required_providers out is saved, planned and built:
// kloud declares kloudlocal itself at the plan (tmpl.DeclareProviders) as at the build
// (ConfigureProvider), instead of Terraform looking for hashicorp/kloudlocal. One that declares
// kloudlocal with another source is refused at save and at plan, saying which source it must
// have. Real kloud, terraformer, terraform with the kloudlocal provider built from this tree,
// and local machines on a private bridge (tfprovidertest.NewHost: root only).
func TestTemplateWithoutRequiredProviders(t *testing.T) {
	t.Parallel()
	h := tfprovidertest.NewHost(t)
	tf, cliConfig := tfprovidertest.Terraform(t)
	testutil.RequireBinary(t, "curl")
	// kloud listens on the bridge address: the machines reach it there, and terraform's
	// kloudlocal provider too.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	addr := net.JoinHostPort(h.HostAddr().String(), port)
	l, err := local.New(local.Options{
		StateDir: h.StateDir, BaseImage: h.BaseImage, Bridge: h.Bridge, Subnet: h.Subnet, Logger: testutil.Logger(t),
		Instance: "kloud-test-declare", Endpoint: "http://" + addr,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Provider().Available(); err != nil {
		t.Fatalf("local provider: %s", err)
	}
	if err := l.SetupNetwork(t.Context()); err != nil {
		t.Fatal(err)
	}
	reg := provider.NewRegistry()
	reg.Register(l.Provider())
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg, Addr: addr, KlientBin: testutil.BuildBinary(t, "./cmd/klient")})
	e.StartTerraformerWith(tfrun.Options{Dir: filepath.Join(t.TempDir(), "terraformer"), TerraformPath: tf, CLIConfigFile: cliConfig})
	if _, err := e.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	f := &flowEnv{Env: e, t: t, alice: e.Dial("alice")}

	// Saved without an error, planned, created and built.
	tid := f.template(`provider "kloudlocal" {}

resource "kloudlocal_machine" "dev" {
  hostname = "dev"
  memory   = 512
}
`)
	plan, err := f.client().StackPlan(t.Context(), api.StackPlanParams{TemplateID: tid})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Machines) != 1 || plan.Machines[0].Label != "dev" || plan.Machines[0].Provider != local.Name {
		t.Fatalf("plan: %+v", plan.Machines)
	}
	sid, _ := f.stack(tid)
	if last := f.follow(f.apply(sid, false)); last.Status != "succeeded" {
		t.Fatalf("build: %+v", last)
	}
	if m := f.machines(sid)["dev"]; m.State != provider.Running || m.Agent.Status != model.AgentConnected {
		t.Fatalf("dev after the build: %+v", m)
	}
	if last := f.follow(f.apply(sid, true)); last.Status != "succeeded" {
		t.Fatalf("destroy: %+v", last)
	}
	if n := len(f.machines(sid)); n != 0 {
		t.Fatalf("%d machines left after destroy", n)
	}

	// Declared with another source: refused at save, naming the block and the source it must have.
	wrong := `terraform {
  required_providers {
    kloudlocal = { source = "hashicorp/kloudlocal" }
  }
}

resource "kloudlocal_machine" "dev" {
  hostname = "dev"
}
`
	_, err = f.client().TemplateCreate(t.Context(), api.TemplateParams{Title: "wrong source", Files: map[string]string{"main.tf": wrong}})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "main.tf:3") ||
		!strings.Contains(err.Error(), `the source of kloudlocal must be "kloud/kloudlocal" (found "hashicorp/kloudlocal")`) {
		t.Fatalf("template with another source for kloudlocal: %v", err)
	}
	// Trusted by an administrator (rule provider lifted), it is saved, and the plan refuses it,
	// as the build would, instead of Terraform looking for a provider it cannot find.
	admin := e.Client(kloud.Admin)
	trusted, err := admin.TemplateCreate(t.Context(), api.TemplateParams{Title: "trusted wrong source", Files: map[string]string{"main.tf": wrong},
		Trust: &api.TrustSpec{Rules: []string{"provider"}, Reason: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.StackPlan(t.Context(), api.StackPlanParams{TemplateID: trusted.ID})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "main.tf:3,") ||
		!strings.Contains(err.Error(), `required_providers.kloudlocal must have source = "kloud/kloudlocal" (found "hashicorp/kloudlocal")`) {
		t.Fatalf("plan of a trusted template with another source for kloudlocal: %v", err)
	}
}
