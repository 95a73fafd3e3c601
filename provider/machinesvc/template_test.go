package machinesvc

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// testTemplate is a machine service template as the local provider configures one.
func testTemplate() *Template {
	return &Template{
		Kind:         "local",
		Provider:     tmpl.ProviderConfig{Name: "kloudlocal", Source: "kloud/kloudlocal", Version: "0.1.0", File: "kloud_local.tf.json"},
		ResourceType: "kloudlocal_machine",
		TokenVar:     "kloud_local_token",
		TagStack:     "kloud_stack",
		TagMachine:   "kloud_machine",
		Endpoint:     "http://127.0.0.1:1",
		Check:        func() error { return nil },
		Token:        func(*provider.BaseStack, []string) (string, error) { return "tok", nil },
	}
}

// Validate refuses, with file and line, what Apply would refuse at build: a file with the
// generated file's name, variables named like the generated ones, a machine's tags that are
// not a literal map; a template within the rules, or without the provider, has no findings.
func TestValidate(t *testing.T) {
	tt := testTemplate()
	for name, tc := range map[string]struct {
		files map[string]string
		want  []string // findings, in order
	}{
		"fine":              {map[string]string{"main.tf": "resource \"kloudlocal_machine\" \"dev\" {\n  count = 2\n  tags  = { team = \"a\" }\n}\n"}, nil},
		"not this provider": {map[string]string{"main.tf": "variable \"kloud_local_token\" {}\nresource \"terraform_data\" \"vm\" {\n  input = \"x\"\n}\n"}, nil},
		"token variable": {map[string]string{"main.tf": "resource \"kloudlocal_machine\" \"dev\" {}\n\nvariable \"kloud_local_token\" {\n  sensitive = true\n}\n"},
			[]string{`main.tf:3: variable "kloud_local_token" is not allowed (rule reserved-name): names starting with kloud_local_ are reserved`}},
		"tag variable": {map[string]string{"vars.tf": "variable \"kloud_local_stack_dev\" {}\n", "main.tf": "resource \"kloudlocal_machine\" \"dev\" {}\n"},
			[]string{`vars.tf:1: variable "kloud_local_stack_dev" is not allowed (rule reserved-name)`}},
		"generated file": {map[string]string{"main.tf": "resource \"kloudlocal_machine\" \"dev\" {}\n", "kloud_local.tf.json": `{"locals": {"a": 1}}`},
			[]string{"kloud_local.tf.json:1: file name kloud_local.tf.json is not allowed (rule reserved-name)"}},
		"tags expression": {map[string]string{"main.tf": "variable \"t\" {\n  default = {}\n}\n\nresource \"kloudlocal_machine\" \"dev\" {\n  tags = var.t\n}\n"},
			[]string{"main.tf:5: kloudlocal_machine.dev: tags is not allowed (rule literal-tags): kloud adds its own tags (kloud_stack, kloud_machine, ...) to the machine's tags, which must be a literal map"}},
		"tags merge in json": {map[string]string{"main.tf.json": `{"resource": {"kloudlocal_machine": {"dev": {"tags": "${merge({}, {})}"}}}}`},
			[]string{"kloudlocal_machine.dev: tags is not allowed (rule literal-tags)"}},
	} {
		t.Run(name, func(t *testing.T) {
			files := map[string][]byte{}
			for n, c := range tc.files {
				files[n] = []byte(c)
			}
			fs, err := tt.Validate(files)
			if err != nil {
				t.Fatal(err)
			}
			if len(fs) != len(tc.want) {
				t.Fatalf("findings %v, want %d: %q", fs, len(tc.want), tc.want)
			}
			for i, f := range fs {
				if !strings.Contains(f.Error(), tc.want[i]) {
					t.Errorf("finding %d: %q, want %q", i, f.Error(), tc.want[i])
				}
			}
			// Apply refuses the same, with the same words.
			b := &provider.BaseStack{Provider: &provider.Provider{Name: "local", ResourceType: tt.ResourceType, UserDataAttr: "user_data"}, StackID: "s",
				Template: &provider.Template{Files: files, Variables: map[string]any{}}}
			_, err = tt.Apply(t.Context(), b)
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Apply: %v, want %q", err, w)
				}
			}
			if len(tc.want) == 0 && err != nil {
				t.Errorf("Apply: %v", err)
			}
		})
	}
}
