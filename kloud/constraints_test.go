package kloud_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// constrained is a provider's stack with a constraints validator over a vocabulary.
type constrained struct {
	provider.Stack
	vocab func() []provider.Constraint
}

func (c *constrained) ValidateConstraints(ctx context.Context, attrs map[string]any) error {
	return provider.ValidateConstraints(c.vocab(), attrs)
}

// TestConstraintsRefusePlan: kloud asks the provider to validate every planned machine at
// stack.plan, stack.create and stack.apply, and refuses with invalid params naming the machine,
// the attribute, what is allowed and the nearest valid value; a valid plan goes through.
func TestConstraintsRefusePlan(t *testing.T) {
	t.Parallel()
	testutil.RequireBinary(t, "curl")
	var maxMem atomic.Int64
	maxMem.Store(4096)
	vocab := func() []provider.Constraint {
		return []provider.Constraint{{Name: provider.ConstraintMem, Attribute: "triggers_replace", Type: provider.ConstraintInteger, Unit: "MB",
			Min: provider.Bounds(32), Max: provider.Bounds(float64(maxMem.Load())), Bound: "this test's host"}}
	}
	p := constrainedDummy(t, vocab) // constraints_reapply_test.go
	reg := provider.NewRegistry()
	reg.Register(p)
	e := kloudtest.Start(t, kloudtest.Options{Providers: reg, KlientBin: testutil.BuildBinary(t, "./cmd/klient")})
	e.StartTerraformer()
	if _, err := e.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	cl := api.NewClient(e.Dial("alice"))
	ctx := t.Context()
	if _, err := cl.CredentialAdd(ctx, api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"s3cret-token"}`)}); err != nil {
		t.Fatal(err)
	}
	desc, err := cl.ProviderDescribe(ctx, api.ProviderDescribeParams{Provider: "dummy"})
	if err != nil || len(desc.Providers) != 1 || len(desc.Providers[0].Constraints) != 1 || desc.Providers[0].Constraints[0].Name != "mem" {
		t.Fatalf("provider.describe: %+v, %v: want the vocabulary", desc, err)
	}
	tmpl := func(mem string) string {
		tp, err := cl.TemplateCreate(ctx, api.TemplateParams{Title: "mem " + mem, Files: map[string]string{"main.tf": `
variable "mem" {
  default = ` + mem + `
}
resource "terraform_data" "vm" {
  count            = 2
  triggers_replace = var.mem
  input            = "#!/bin/bash\necho hi\n"
}
`}})
		if err != nil {
			t.Fatal(err)
		}
		return tp.ID
	}
	refused := func(what string, err error, wantMsg ...string) {
		t.Helper()
		if !errors.Is(err, kite.ErrInvalidParams) {
			t.Fatalf("%s: %v, want invalid params", what, err)
		}
		for _, w := range wantMsg {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", what, err, w)
			}
		}
		var ke *kite.Error
		if !errors.As(err, &ke) || ke.Type() != api.ConstraintViolationType {
			t.Fatalf("%s: %#v: want data.type %s", what, err, api.ConstraintViolationType)
		}
		b, _ := json.Marshal(ke.Data.Details)
		var vs []api.ConstraintViolation
		if err := json.Unmarshal(b, &vs); err != nil || len(vs) != 2 {
			t.Fatalf("%s: details %s: want 2 violations (%v)", what, b, err)
		}
		if v := vs[0]; v.Machine != "vm.0" || v.Provider != "dummy" || v.Resource != "terraform_data.vm" || v.Constraint != "mem" ||
			v.Attribute != "triggers_replace" || v.Allowed == "" || v.Nearest == nil {
			t.Errorf("%s: violation %+v", what, v)
		}
		t.Logf("%s: refused: %v", what, err)
	}

	big := tmpl("100000")
	_, err = cl.StackPlan(ctx, api.StackPlanParams{TemplateID: big})
	refused("stack.plan", err, "machine vm.0 (terraform_data.vm): mem (triggers_replace) 100000 MB is more than the 4096 MB this test's host allows",
		"nearest valid: 4096", "machine vm.1")
	// A variable's value is what is checked (terraform's plan resolves it).
	_, err = cl.StackCreate(ctx, api.StackPlanParams{TemplateID: big, Variables: map[string]string{"mem": "8"}})
	refused("stack.create with mem = 8", err, "is less than the 32 MB", "nearest valid: 32")
	if l, err := cl.StackList(ctx, api.StackListParams{}); err != nil || len(l.Stacks) != 0 {
		t.Fatalf("stack.list after refused creates: %+v, %v", l, err)
	}

	// The nearest valid value passes.
	res, err := cl.StackCreate(ctx, api.StackPlanParams{TemplateID: big, Variables: map[string]string{"mem": "4096"}})
	if err != nil {
		t.Fatalf("stack.create with the nearest valid value: %v", err)
	}
	// The host shrank before the build: stack.apply refuses, and the stack stays as it was.
	maxMem.Store(1024)
	_, err = cl.StackApply(ctx, api.StackApplyParams{StackID: res.Stack.ID})
	refused("stack.apply", err, "4096 MB is more than the 1024 MB", "nearest valid: 1024")
	d, err := cl.StackDescribe(ctx, api.StackRef{StackID: res.Stack.ID})
	if err != nil || d.State != model.StackNotInitialized || d.JobID != "" {
		t.Fatalf("stack after a refused apply: %+v, %v", d, err)
	}
	// Destroy is never refused for constraints.
	ref, err := cl.StackApply(ctx, api.StackApplyParams{StackID: res.Stack.ID, Destroy: true})
	if err != nil {
		t.Fatalf("stack.apply destroy: %v", err)
	}
	w, err := cl.JobWatch(ctx, api.JobRef{JobID: ref.JobID})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var last api.JobEvent
	for {
		ev, err := w.Next(ctx)
		if errors.Is(err, kite.ErrStreamEnded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		last = ev
	}
	if last.Status != api.JobSucceeded {
		t.Fatalf("destroy: %+v", last)
	}
}
