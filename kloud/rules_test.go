package kloud_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// dockerRefused are docker templates the docker provider refuses (issue 18): each argument on
// line 4 of main.tf.
var dockerRefused = []struct{ arg, body string }{
	{"privileged", "privileged = true"},
	{"volumes", "volumes {\n    host_path      = \"/\"\n    container_path = \"/host\"\n  }"},
	{"ports", "ports {\n    internal = 22\n    external = 2222\n  }"},
}

func dockerTemplate(body string) string {
	return "resource \"docker_container\" \"vm\" {\n  name  = \"vm\"\n  image = \"kloud\"\n  " + body + "\n}\n"
}

// wantRuleRefusal: invalid params naming the docker provider's rule, main.tf line 4, the
// argument and what is allowed.
func wantRuleRefusal(t *testing.T, when string, err error, arg string) {
	t.Helper()
	if !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("%s: want invalid params from the docker provider's rules, got %v", when, err)
	}
	for _, want := range []string{"docker provider's rules", "main.tf:4: docker_container.vm: " + arg + " is not allowed (rule docker-argument)", "may set only", "cpus"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: want %q in: %v", when, want, err)
		}
	}
}

// newDockerFlow is a kloud with the dummy and the docker provider (whose daemon is absent: the
// rules are static, nothing reaches a daemon) and a terraformer.
func newDockerFlow(t *testing.T) (*kloudtest.Env, *api.Client) {
	t.Helper()
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: dummyDir(t)}))
	d, err := docker.New(docker.Options{Host: "unix://" + filepath.Join(t.TempDir(), "no-daemon.sock"), Image: "kloud-test", StateDir: t.TempDir(),
		Endpoint: "http://127.0.0.1:1", NoFirewall: true})
	if err != nil {
		t.Fatal(err)
	}
	reg.Register(d.Provider())
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg})
	e.StartTerraformerWith(tfrun.Options{Dir: filepath.Join(t.TempDir(), "terraformer")})
	if _, err := e.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	return e, api.NewClient(e.Dial("alice"))
}

// TestProviderRulesAtSave (issue 18 item 2): the docker provider's rules refuse privileged, a
// volumes block and a ports block at template.create and template.update (nothing stored), at
// stack.plan and stack.create of a revision stored before (no job, no stack), and at
// stack.apply of a stack stored before (no job, the stack unchanged, not Failed); destroying
// that stack works (terraform never ran its files). The messages name file, line, rule and
// what is allowed, as the build's did.
func TestProviderRulesAtSave(t *testing.T) {
	t.Parallel()
	e, alice := newDockerFlow(t)
	ctx := t.Context()
	jobs := func() int {
		t.Helper()
		res, err := alice.JobList(ctx, api.JobListParams{})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Jobs)
	}
	templates := func() int {
		t.Helper()
		res, err := alice.TemplateList(ctx, api.TemplateListParams{})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Templates)
	}

	ok, err := alice.TemplateCreate(ctx, api.TemplateParams{Title: "fine", Files: map[string]string{"main.tf": dockerTemplate("memory = 512")}})
	if err != nil {
		t.Fatalf("a docker template within the rules: %v", err)
	}
	// The policy's refusals and the provider's come together.
	both := "resource \"docker_container\" \"vm\" {\n  name  = \"vm\"\n  image = \"kloud\"\n  privileged = true\n  provisioner \"local-exec\" {\n    command = \"id\"\n  }\n}\n"
	_, err = alice.TemplateCreate(ctx, api.TemplateParams{Title: "both", Files: map[string]string{"main.tf": both}})
	wantRuleRefusal(t, "template.create", err, "privileged")
	wantPolicyRefusal(t, "template.create", err, "provisioner", "main.tf:5:3")

	for _, tc := range dockerRefused {
		t.Run(tc.arg, func(t *testing.T) {
			src := dockerTemplate(tc.body)
			stored := templates()
			_, err := alice.TemplateCreate(ctx, api.TemplateParams{Title: tc.arg, Files: map[string]string{"main.tf": src}})
			wantRuleRefusal(t, "template.create", err, tc.arg)
			t.Logf("template.create: %v", err)
			if n := templates(); n != stored {
				t.Fatalf("template.create refused, yet %d templates are stored (were %d)", n, stored)
			}
			_, err = alice.TemplateUpdate(ctx, api.TemplateParams{TemplateID: ok.ID, Files: map[string]string{"main.tf": src}})
			wantRuleRefusal(t, "template.update", err, tc.arg)
			if v, err := alice.TemplateGet(ctx, api.TemplateGetParams{TemplateID: ok.ID}); err != nil || v.Rev != 1 || len(v.Revisions) != 0 {
				t.Fatalf("template.update refused, yet the template changed: %+v %v", v.Template, err)
			}

			// A revision stored before the rules were checked at save (as an older kloud did).
			now := time.Now()
			tpl := model.Template{ID: store.NewID(), Title: tc.arg, Team: model.DefaultTeam, Owner: "alice", Rev: 1,
				Files: []model.File{{Name: "main.tf", Content: dockerTemplate("memory = 256")}}, CreatedAt: now, UpdatedAt: now}
			if err := e.Server.Store().Templates().Insert(ctx, tpl); err != nil {
				t.Fatal(err)
			}
			storetest.SetFields(t, e.Server.Store(), store.CollTemplates, tpl.ID, map[string]any{"rev": 2, "files": []model.File{{Name: "main.tf", Content: src}}})
			before := jobs()
			_, err = alice.StackPlan(ctx, api.StackPlanParams{TemplateID: tpl.ID})
			wantRuleRefusal(t, "stack.plan", err, tc.arg)
			_, err = alice.StackCreate(ctx, api.StackPlanParams{TemplateID: tpl.ID})
			wantRuleRefusal(t, "stack.create", err, tc.arg)
			if n := jobs(); n != before {
				t.Fatalf("refused plan and create: %d jobs, were %d", n, before)
			}
			if sl, err := alice.StackList(ctx, api.StackListParams{}); err != nil || len(sl.Stacks) != 0 {
				t.Fatalf("stack.create refused, yet stacks: %+v %v", sl, err)
			}

			// A stack stored with those files, as an older kloud made it: stack.apply refuses
			// before any job, and the stack stays as it was (not Failed).
			st := model.Stack{ID: store.NewID(), Title: tc.arg, Team: model.DefaultTeam, Owner: "alice", TemplateID: tpl.ID, TemplateRev: 2,
				Files: []model.File{{Name: "main.tf", Content: src}}, State: model.StackNotInitialized, Machines: []string{}, CreatedAt: now, UpdatedAt: now}
			if err := e.Server.Store().Stacks().Insert(ctx, st); err != nil {
				t.Fatal(err)
			}
			_, err = alice.StackApply(ctx, api.StackApplyParams{StackID: st.ID})
			wantRuleRefusal(t, "stack.apply", err, tc.arg)
			if n := jobs(); n != before {
				t.Fatalf("refused apply: %d jobs, were %d", n, before)
			}
			got, err := e.Server.Store().Stacks().Get(ctx, st.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != model.StackNotInitialized || got.JobID != "" {
				t.Fatalf("stack after the refused apply: %s %q (job %q)", got.State, got.Reason, got.JobID)
			}
			// Terraform never ran the files: destroy has nothing of them to run, and succeeds.
			ref, err := alice.StackApply(ctx, api.StackApplyParams{StackID: st.ID, Destroy: true})
			if err != nil {
				t.Fatal(err)
			}
			if last := followJob(t, alice, ref.JobID); last.Status != api.JobSucceeded {
				t.Fatalf("destroy: %+v", last)
			}
		})
	}
}

// followJob watches a job to its end and returns the last event.
func followJob(t *testing.T, c *api.Client, id string) api.JobEvent {
	t.Helper()
	w, err := c.JobWatch(t.Context(), api.JobRef{JobID: id})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var last api.JobEvent
	for {
		ev, err := w.Next(t.Context())
		if errors.Is(err, kite.ErrStreamEnded) {
			return last
		}
		if err != nil {
			t.Fatal(err)
		}
		last = ev
	}
}

// ruledStack is the dummy's stack with a template rule of its own: a machine's input may not be
// the literal "forbidden".
type ruledStack struct{ provider.Stack }

func (ruledStack) ValidateTemplate(ctx context.Context, files map[string][]byte) ([]provider.TemplateFinding, error) {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return nil, err
	}
	var out []provider.TemplateFinding
	for _, r := range cfg.Resources("terraform_data") {
		if cfg.LiteralAttrs("terraform_data", r.Name)["input"] == "forbidden" {
			out = append(out, provider.TemplateFinding{File: r.File, Line: r.Line, Construct: "terraform_data." + r.Name + ": input", Rule: "dummy-input", Detail: "not \"forbidden\""})
		}
	}
	return out, nil
}

// TestDestroyDespiteProviderRules: a built stack whose files break a provider's rule (as an
// older kloud left it) is destroyed: the rules say what a provider builds, a destroy builds
// nothing, and nothing could lift them; the template policy still holds at destroy
// (TestDestroyObeysPolicy). The same rule refuses template.create.
func TestDestroyDespiteProviderRules(t *testing.T) {
	t.Parallel()
	testutil.RequireBinary(t, "curl")
	reg := provider.NewRegistry()
	o := dummy.Options{Dir: dummyDir(t)}
	p := dummy.New(o)
	inner := p.Stack
	p.Stack = func(b *provider.BaseStack) (provider.Stack, error) {
		st, err := inner(b)
		return ruledStack{st}, err
	}
	reg.Register(p)
	if !p.Can(provider.CapTemplateRules) {
		t.Fatalf("the dummy with a rule does not advertise %s: %v", provider.CapTemplateRules, p.Caps())
	}
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg, KlientBin: testutil.BuildBinary(t, "./cmd/klient")})
	tfDir := filepath.Join(t.TempDir(), "terraformer")
	e.StartTerraformerWith(tfrun.Options{Dir: tfDir})
	if _, err := e.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	f := &flowEnv{Env: e, t: t, dir: o.Dir, tfDir: tfDir, alice: e.Dial("alice")}
	t.Cleanup(f.killMachines)
	f.credential()

	forbidden := "resource \"terraform_data\" \"vm\" {\n  input = \"forbidden\"\n}\n"
	_, err := f.client().TemplateCreate(t.Context(), api.TemplateParams{Title: "x", Files: map[string]string{"main.tf": forbidden}})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "main.tf:1: terraform_data.vm: input is not allowed (rule dummy-input)") {
		t.Fatalf("template.create against the dummy's rule: %v", err)
	}

	sid, _ := f.stack(f.template("resource \"terraform_data\" \"vm\" {\n  input = \"echo hi\"\n}\n"))
	ref, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(ref.JobID); last.Status != api.JobSucceeded {
		t.Fatalf("build: %+v", last)
	}
	storetest.SetFields(t, e.Server.Store(), store.CollStacks, sid, map[string]any{"files": []model.File{{Name: "main.tf", Content: forbidden}}})
	if ref, err = f.client().StackApply(t.Context(), api.StackApplyParams{StackID: sid, Destroy: true}); err != nil {
		t.Fatal(err)
	}
	if last := f.follow(ref.JobID); last.Status != api.JobSucceeded {
		t.Fatalf("destroy of a stack whose files break a provider's rule: %+v", last)
	}
	if _, err := e.Server.Store().Stacks().Get(t.Context(), sid); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("stack after the destroy: %v", err)
	}
}
