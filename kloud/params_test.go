package kloud_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// paramsTemplateFile holds typed parameters and a preset (shared with the CLI and browser tests).
const paramsTemplateFile = "provider/tmpl/testdata/params.tf"

// TestStackParameters: through the real API and a real terraform, template.parameters lists a
// template's typed parameters and presets; stack.create refuses values that fail their type,
// choices or validation (with the variable's own error_message), unknown names and missing
// required values, before anything is created; it applies the default preset under explicit
// values; the values reach terraform typed; a sensitive value is never in a response; and
// stack.update refuses to change an immutable parameter of the built stack but changes a
// mutable one.
func TestStackParameters(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	c := f.client()
	ctx := t.Context()
	paramsTemplate := testutil.ModuleFile(t, paramsTemplateFile)

	// A kloud_parameter naming no variable is refused when the template is saved, with the line.
	_, err := c.TemplateCreate(ctx, api.TemplateParams{Title: "bad", Files: map[string]string{"main.tf": paramsTemplate + "kloud_parameter \"colour\" {\n  order = 2\n}\n"}})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), fmt.Sprintf(`main.tf:%d: kloud_parameter "colour"`, strings.Count(paramsTemplate, "\n")+1)) {
		t.Fatalf("bad kloud_parameter: %v", err)
	}

	tid := f.template(paramsTemplate)
	ps, err := c.TemplateParameters(ctx, api.TemplateGetParams{TemplateID: tid})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ps.Parameters {
		names = append(names, p.Name)
	}
	// dummy_token is the credential's (kloud fills it), not a parameter.
	if got := strings.Join(names, ","); got != "size,cpus,tags,api_key" {
		t.Fatalf("parameters: %s", got)
	}
	size := ps.Parameters[0]
	if size.DisplayName != "Machine size" || size.Mutable || len(size.Choices) != 2 || string(size.Default) != `"small"` || !ps.Parameters[3].Required || !ps.Parameters[3].Sensitive {
		t.Fatalf("parameters: %+v", ps.Parameters)
	}
	if len(ps.Presets) != 1 || !ps.Presets[0].Default || string(ps.Presets[0].Values["size"]) != `"large"` {
		t.Fatalf("presets: %+v", ps.Presets)
	}

	create := func(params map[string]string, preset *string) (api.StackCreateResult, error) {
		p := api.StackPlanParams{TemplateID: tid, Parameters: map[string]json.RawMessage{}, Preset: preset}
		for k, v := range params {
			p.Parameters[k] = json.RawMessage(v)
		}
		return c.StackCreate(ctx, p)
	}
	for _, tc := range []struct {
		params map[string]string
		want   string
	}{
		{map[string]string{"api_key": `"k3y-value"`, "cpus": "9"}, `parameter "cpus": A machine has 1 to 4 CPUs.`},
		{map[string]string{"api_key": `"k3y-value"`, "size": `"huge"`}, `parameter "size": "huge" is not one of the choices: "small", "large"`},
		{map[string]string{"api_key": `"k3y-value"`, "tags": `"not a list"`}, `parameter "tags": a list(string) is needed`},
		{map[string]string{"api_key": `"k3y-value"`, "colour": `"red"`}, `parameter "colour": the template has no such parameter`},
		{map[string]string{}, `parameter "api_key": a value is required`},
	} {
		_, err := create(tc.params, nil)
		if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%v: want invalid params %q, got %v", tc.params, tc.want, err)
		}
	}
	if l, err := c.StackList(ctx, api.StackListParams{}); err != nil || len(l.Stacks) != 0 {
		t.Fatalf("refused creates left stacks: %v %v", l.Stacks, err)
	}

	// A plan job keeps its params for job.get: the sensitive value is sealed there.
	pref, err := c.StackPlanJob(ctx, api.StackPlanParams{TemplateID: tid, Parameters: map[string]json.RawMessage{"api_key": json.RawMessage(`"k3y-value"`)}})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(pref.JobID); last.Status != "succeeded" {
		t.Fatalf("plan job: %+v", last)
	}
	if job, err := c.JobGet(ctx, api.JobRef{JobID: pref.JobID}); err != nil {
		t.Fatal(err)
	} else if b, _ := json.Marshal(job); strings.Contains(string(b), "k3y-value") || !strings.Contains(string(b), `"sealed"`) {
		t.Fatalf("the plan job's record: %s", b)
	}

	res, err := create(map[string]string{"api_key": `"k3y-value"`, "cpus": "3", "tags": `["a","b"]`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := res.Stack
	if st.Preset != "big" || st.Variables["size"] != "large" || st.Variables["cpus"] != "3" || st.Variables["tags"] != `["a","b"]` {
		t.Fatalf("stack keeps preset %q, variables %v", st.Preset, st.Variables)
	}
	view, err := c.StackDescribe(ctx, api.StackRef{StackID: st.ID})
	if err != nil {
		t.Fatal(err)
	}
	for what, v := range map[string]any{"create": res, "describe": view} {
		if b, _ := json.Marshal(v); strings.Contains(string(b), "k3y-value") || strings.Contains(string(b), "api_key") {
			t.Fatalf("%s shows the sensitive value: %s", what, b)
		}
	}

	ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: st.ID})
	f.jobOK("build", ref, err)
	job, err := c.JobGet(ctx, api.JobRef{JobID: ref.JobID})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(job); strings.Contains(string(b), "k3y-value") {
		t.Fatalf("the job shows the sensitive value: %s", b)
	}
	// The build got it (api_key has no default: terraform refuses to plan without it), and the
	// store holds it sealed only (Stack.SecretSealed).
	if strings.Contains(storeText(t, f.Server.Store()), "k3y-value") {
		t.Fatal("the store holds the sensitive value in the clear")
	}

	// Immutable: refused with the reason, no job, nothing changes.
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: st.ID, Parameters: map[string]json.RawMessage{"size": json.RawMessage(`"small"`)}})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "parameter size cannot change after the stack is built; create a new stack") {
		t.Fatalf("immutable change: job %q, %v", ref.JobID, err)
	}
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: st.ID, Parameters: map[string]json.RawMessage{"cpus": json.RawMessage(`5`)}})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "A machine has 1 to 4 CPUs.") {
		t.Fatalf("invalid change: job %q, %v", ref.JobID, err)
	}
	// The same value again is no change; a mutable one changes.
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: st.ID, Parameters: map[string]json.RawMessage{"size": json.RawMessage(`"large"`), "cpus": json.RawMessage(`2`)}})
	f.jobOK("update", ref, err)
	view, err = c.StackDescribe(ctx, api.StackRef{StackID: st.ID})
	if err != nil {
		t.Fatal(err)
	}
	if view.Variables["cpus"] != "2" || view.Variables["size"] != "large" {
		t.Fatalf("after the update: %v", view.Variables)
	}
	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: st.ID, Destroy: true})
	f.jobOK("destroy", ref, err)

	// No preset: the template's defaults.
	none := ""
	res, err = create(map[string]string{"api_key": `"k3y-value"`}, &none)
	if err != nil || res.Stack.Preset != "" || len(res.Stack.Variables) != 0 {
		t.Fatalf("no preset: %+v %v", res.Stack, err)
	}
}

// TestScaleRespectsParameters: stack.scale of a resource whose count is a parameter changes it
// as stack.update would: within its validation, and not when it is immutable.
func TestScaleRespectsParameters(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	c := f.client()
	ctx := t.Context()
	tpl := `variable "n" {
  type    = number
  default = 1
  validation {
    condition     = var.n <= 2
    error_message = "At most 2 machines."
  }
}

resource "terraform_data" "vm" {
  count = var.n
  input = "#!/bin/bash\necho hi\n"
}
`
	tid := f.template(tpl)
	sid, _ := f.stack(tid)
	ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid})
	f.jobOK("build", ref, err)
	ref, err = c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "vm", Count: 3})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), `parameter "n": At most 2 machines.`) {
		t.Fatalf("scale past the validation: job %q, %v", ref.JobID, err)
	}
	ref, err = c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "vm", Count: 2})
	f.jobOK("scale to 2", ref, err)

	f.updateTemplate(tid, tpl+"kloud_parameter \"n\" {\n  mutable = false\n}\n")
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
	f.jobOK("update to revision 2", ref, err)
	ref, err = c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "vm", Count: 1})
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "parameter n cannot change after the stack is built") {
		t.Fatalf("scale of an immutable count: job %q, %v", ref.JobID, err)
	}
	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
	f.jobOK("destroy", ref, err)
}

// TestParamsUpdateKeepsScale: changing a scaled stack's parameters at its own revision keeps its
// scale (its own files), as stack.scale does.
func TestParamsUpdateKeepsScale(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	c := f.client()
	ctx := t.Context()
	tid := f.template(`variable "greeting" {
  type    = string
  default = "hi"
}

resource "terraform_data" "vm" {
  count = 1
  input = "#!/bin/bash\necho ${var.greeting}\n"
}
`)
	sid, _ := f.stack(tid)
	ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid})
	f.jobOK("build", ref, err)
	ref, err = c.StackScale(ctx, api.StackScaleParams{StackID: sid, Resource: "vm", Count: 2})
	f.jobOK("scale to 2", ref, err)
	ref, err = c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid, TemplateRevision: 1, Parameters: map[string]json.RawMessage{"greeting": json.RawMessage(`"hello"`)}})
	f.jobOK("change a parameter", ref, err)
	st, err := c.StackDescribe(ctx, api.StackRef{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.MachineDocs) != 2 || !st.Diverged || st.Variables["greeting"] != "hello" {
		t.Fatalf("after the parameter change: %d machines, diverged %v, variables %v", len(st.MachineDocs), st.Diverged, st.Variables)
	}
	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
	f.jobOK("destroy", ref, err)
}
