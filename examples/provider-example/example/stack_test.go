package example_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kloud-dev/kloud/examples/provider-example/example"
	"github.com/kloud-dev/kloud/provider"
)

// TestApplyTemplateVacating: a template that declares none of the example's machines (a stack
// update removing them all: BaseStack.Vacating) is left alone while the stack has no machine of
// the example; while it has one (its record), ApplyTemplate keeps that resource's kloud_life_
// block, with no instances and its destroy-time provisioner, so that Terraform destroys it.
func TestApplyTemplateVacating(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := example.New(example.Options{Dir: dir})
	cred := &provider.Credential{Provider: "example", Team: "default", Value: &example.Credential{Label: "t", MaxMachines: 2}}
	apply := func() *provider.Template {
		t.Helper()
		st, err := p.Stack(&provider.BaseStack{Provider: p, StackID: "st1", Team: "default", Owner: "alice", Vacating: true,
			Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte("output \"x\" {\n  value = 1\n}\n")}, Variables: map[string]any{}}})
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := st.ApplyTemplate(t.Context(), cred)
		if err != nil {
			t.Fatal(err)
		}
		return tpl
	}
	if tpl := apply(); len(tpl.Files) != 1 || len(tpl.Variables) != 0 {
		t.Fatalf("a stack without machines of the example: template rewritten: %q %v", tpl.Files, tpl.Variables)
	}
	rec := filepath.Join(dir, "machines", "st1", "vm.0.json")
	if err := os.MkdirAll(filepath.Dir(rec), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rec, []byte(`{"id":"6f1c","machine":"m1","owner":"alice","instance":"i1","complete":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tpl := apply()
	var gen struct {
		Variable map[string]any
		Resource struct {
			TerraformData map[string]struct {
				Count       *int
				Provisioner []map[string]struct {
					When        string
					Command     string
					Environment map[string]string
				}
			} `json:"terraform_data"`
		}
	}
	if err := json.Unmarshal(tpl.Files["kloud_example.tf.json"], &gen); err != nil {
		t.Fatalf("generated file: %v\n%s", err, tpl.Files["kloud_example.tf.json"])
	}
	life, ok := gen.Resource.TerraformData["kloud_life_vm"]
	if !ok || len(gen.Resource.TerraformData) != 1 || life.Count == nil || *life.Count != 0 || len(gen.Variable) != 0 || len(tpl.Variables) != 0 {
		t.Fatalf("generated file of a vacating stack with machine vm.0:\n%s\nvariables %v", tpl.Files["kloud_example.tf.json"], tpl.Variables)
	}
	if len(life.Provisioner) != 1 || life.Provisioner[0]["local-exec"].When != "destroy" || life.Provisioner[0]["local-exec"].Environment["TOKEN"] != "${self.input.token}" {
		t.Fatalf("kloud_life_vm's provisioner: %+v", life.Provisioner)
	}
}
