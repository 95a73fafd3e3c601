package kloud_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// tagsVocab is a vocabulary whose tags constraint is carried by terraform_data's
// triggers_replace (a map in the templates below); asList makes it a list constraint instead
// (a provider whose rules changed after the build).
func tagsVocab(asList *atomic.Bool) func() []provider.Constraint {
	return func() []provider.Constraint {
		typ := provider.ConstraintMap
		if asList.Load() {
			typ = provider.ConstraintList
		}
		return []provider.Constraint{{Name: provider.ConstraintTags, Attribute: "triggers_replace", Type: typ}}
	}
}

// constrainedDummy is the dummy provider with a constraints vocabulary its stacks validate.
func constrainedDummy(t *testing.T, vocab func() []provider.Constraint) *provider.Provider {
	t.Helper()
	p := dummy.New(dummy.Options{Dir: dummyDir(t)})
	inner := p.Stack
	p.Stack = func(b *provider.BaseStack) (provider.Stack, error) {
		st, err := inner(b)
		return &constrained{Stack: st, vocab: vocab}, err
	}
	p.Constraints = vocab
	if !p.Can(provider.CapConstraints) {
		t.Fatalf("capabilities %v: want constraints (its stack validates them)", p.Caps())
	}
	return p
}

// TestCheckStackConstraintsOfStateValues: a built machine's attributes as kloud recorded them
// from terraform's state (kloud's own tags among the template's), read back from the store, pass
// the provider's map constraint; a recorded value that is not a map is still refused, naming the
// machine.
func TestCheckStackConstraintsOfStateValues(t *testing.T) {
	t.Parallel()
	var asList atomic.Bool
	reg := provider.NewRegistry()
	reg.Register(constrainedDummy(t, tagsVocab(&asList)))
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg})
	ctx := t.Context()
	now := time.Now()
	// As settleMachines records them: the state's values of the resource instance.
	stateAttrs := func(tags any) map[string]any {
		return map[string]any{"id": "x", "memory": 512.0, "triggers_replace": tags}
	}
	stateTags := map[string]any{"kloud_machine": "m1", "kloud_owner": "admin", "kloud_stack": "s1", "kloud_team": model.DefaultTeam, "team": "a"}
	machines := []model.Machine{
		{ID: "m1", StackID: "s1", Label: "dev.0", Resource: "dev", Provider: "dummy", Owner: "admin", Team: model.DefaultTeam, State: provider.Running,
			Attributes: stateAttrs(stateTags), CreatedAt: now, UpdatedAt: now},
		{ID: "m2", StackID: "s1", Label: "dev.1", Resource: "dev", Provider: "dummy", Owner: "admin", Team: model.DefaultTeam, State: provider.Running,
			Attributes: stateAttrs(stateTags), CreatedAt: now, UpdatedAt: now},
		{ID: "m3", StackID: "s2", Label: "bad", Resource: "bad", Provider: "dummy", Owner: "admin", Team: model.DefaultTeam, State: provider.NotInitialized,
			Attributes: stateAttrs(`{"team":"a"}`), CreatedAt: now, UpdatedAt: now},
	}
	if err := e.Server.Store().Machines().InsertMany(ctx, machines); err != nil {
		t.Fatal(err)
	}
	for _, st := range []model.Stack{
		{ID: "s1", Owner: "admin", Team: model.DefaultTeam, State: model.StackInitialized, Machines: []string{"m1", "m2"}, CreatedAt: now, UpdatedAt: now},
		{ID: "s2", Owner: "admin", Team: model.DefaultTeam, State: model.StackNotInitialized, Machines: []string{"m3"}, CreatedAt: now, UpdatedAt: now},
	} {
		if err := e.Server.Store().Stacks().Insert(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Server.CheckStackConstraints(ctx, "s1"); err != nil {
		t.Fatalf("the state's tags, read back from the store: %v", err)
	}
	err := e.Server.CheckStackConstraints(ctx, "s2")
	var ke *kite.Error
	if !errors.As(err, &ke) || ke.Code != kite.CodeInvalidParams || ke.Type() != api.ConstraintViolationType ||
		!strings.Contains(err.Error(), `machine bad (terraform_data.bad): tags (triggers_replace) "{\"team\":\"a\"}" is not a map`) {
		t.Fatalf("tags that are a string: %v, want -32602 saying they are not a map", err)
	}
	asList.Store(true)
	if err := e.Server.CheckStackConstraints(ctx, "s1"); err == nil || !strings.Contains(err.Error(), "machine dev.0") || !strings.Contains(err.Error(), "is not a list") {
		t.Fatalf("a map where the provider wants a list: %v", err)
	}
}

// TestReapplyBuiltStack: stack.apply of a stack with a map attribute builds (its recorded
// attributes, read back from the store, are a map), and applying the built stack again, twice,
// is an update of its own files that changes nothing: the same machines, kite ids and agents.
// A built stack the provider's constraints now refuse is refused by the update's plan (-32602,
// no job, the stack as it was), and kloud logs the refusal.
func TestReapplyBuiltStack(t *testing.T) {
	t.Parallel()
	testutil.RequireBinary(t, "curl")
	var asList atomic.Bool
	reg := provider.NewRegistry()
	reg.Register(constrainedDummy(t, tagsVocab(&asList)))
	logs := &logBuffer{t: t}
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg, KlientBin: testutil.BuildBinary(t, "./cmd/klient"),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	e.StartTerraformer()
	if _, err := e.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(e.Dial("alice"))
	ctx := t.Context()
	if _, err := cl.CredentialAdd(ctx, api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"s3cret-token"}`)}); err != nil {
		t.Fatal(err)
	}
	tmpl := func(tags string) string {
		tp, err := cl.TemplateCreate(ctx, api.TemplateParams{Title: "tagged", Files: map[string]string{"main.tf": `
resource "terraform_data" "dev" {
  count            = 2
  triggers_replace = ` + tags + `
  input            = "#!/bin/bash\necho hi\n"
}
`}})
		if err != nil {
			t.Fatal(err)
		}
		return tp.ID
	}
	// A template that really gives a non-map is refused.
	_, err := cl.StackCreate(ctx, api.StackPlanParams{TemplateID: tmpl(`"{\"team\":\"a\"}"`)})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "is not a map") {
		t.Fatalf("stack.create of a template whose tags are a string: %v, want -32602 saying it is not a map", err)
	}

	res, err := cl.StackCreate(ctx, api.StackPlanParams{TemplateID: tmpl(`{ team = "a" }`)})
	if err != nil {
		t.Fatal(err)
	}
	sid := res.Stack.ID
	follow := func(what string) {
		t.Helper()
		ref, err := cl.StackApply(ctx, api.StackApplyParams{StackID: sid})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if last := followJob(t, cl, ref.JobID); last.Status != api.JobSucceeded {
			t.Fatalf("%s: %+v", what, last)
		}
	}
	machines := func() map[string]model.Machine {
		t.Helper()
		l, err := cl.MachineList(ctx, api.MachineListParams{StackID: sid})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]model.Machine{}
		for _, m := range l.Machines {
			out[m.Label] = m
		}
		return out
	}
	follow("build")
	built := machines()
	if len(built) != 2 {
		t.Fatalf("machines after the build: %+v", built)
	}
	for _, try := range []string{"apply of the built stack", "apply of the built stack again"} {
		follow(try)
		again := machines()
		for label, m := range built {
			a := again[label]
			if a.ID != m.ID || a.KiteID != m.KiteID || a.KiteID == "" || a.State != provider.Running || a.Agent.Status != model.AgentConnected {
				t.Fatalf("%s: %s was %+v, is %+v", try, label, m, a)
			}
		}
		if len(again) != len(built) {
			t.Fatalf("%s: machines %+v", try, again)
		}
	}

	asList.Store(true)
	_, err = cl.StackApply(ctx, api.StackApplyParams{StackID: sid})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "is not a list") {
		t.Fatalf("apply of a built stack the constraints now refuse: %v, want -32602", err)
	}
	d, err := cl.StackDescribe(ctx, api.StackRef{StackID: sid})
	if err != nil || d.State != model.StackInitialized {
		t.Fatalf("stack after a refused apply: %+v, %v", d, err)
	}
	if l := logs.String(); !strings.Contains(l, "stack.apply refused") || !strings.Contains(l, "is not a list") {
		t.Errorf("kloud did not log the refusal:\n%s", l)
	}
	ref, err := cl.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
	if err != nil {
		t.Fatal(err)
	}
	if last := followJob(t, cl, ref.JobID); last.Status != api.JobSucceeded {
		t.Fatalf("destroy: %+v", last)
	}
}
