package docker_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/docker"
)

// The docker provider's static rules as kloud asks them at save and plan
// (provider.TemplateValidator, advertised as templateRules): findings naming file, line and
// rule, the same words ApplyTemplate refuses with at build; a template without docker
// machines has none.
func TestValidateTemplate(t *testing.T) {
	t.Parallel()
	d, err := docker.New(docker.Options{Host: "unix:///nonexistent.sock", Image: "i", StateDir: t.TempDir(), Endpoint: "http://127.0.0.1:1", NoFirewall: true})
	if err != nil {
		t.Fatal(err)
	}
	p := d.Provider()
	if !p.Can(provider.CapTemplateRules) {
		t.Fatalf("the docker provider does not advertise %s: %v", provider.CapTemplateRules, p.Caps())
	}
	st, err := p.Stack(&provider.BaseStack{Provider: p})
	if err != nil {
		t.Fatal(err)
	}
	tv, ok := st.(provider.TemplateValidator)
	if !ok {
		t.Fatal("the docker provider's stack is not a provider.TemplateValidator")
	}
	machine := "resource \"docker_container\" \"vm\" {\n  name  = \"vm\"\n  image = \"kloud\"\n  %s\n}\n"
	for name, tc := range map[string]struct {
		files map[string]string
		want  []string // "rule|text", in order
	}{
		"fine":      {map[string]string{"main.tf": strings.Replace(machine, "%s", "cpus = \"1\"", 1)}, nil},
		"no docker": {map[string]string{"main.tf": "variable \"kloud_docker_x\" {}\nresource \"terraform_data\" \"vm\" {\n  input = \"x\"\n}\n"}, nil},
		"privileged and ports": {map[string]string{"main.tf": strings.Replace(machine, "%s", "privileged = true\n  ports {\n    internal = 80\n  }", 1)},
			[]string{"docker-argument|main.tf:4: docker_container.vm: privileged is not allowed (rule docker-argument): kloud's docker machines may set only count, cpu_set",
				"docker-argument|main.tf:5: docker_container.vm: ports is not allowed (rule docker-argument)"}},
		"reserved variable": {map[string]string{"main.tf": strings.Replace(machine, "%s", "", 1), "vars.tf": "variable \"kloud_docker_image_vm\" {}\n"},
			[]string{`reserved-name|vars.tf:1: variable "kloud_docker_image_vm" is not allowed (rule reserved-name)`}},
		"reserved file": {map[string]string{"main.tf": strings.Replace(machine, "%s", "", 1), docker.GeneratedFile: `{"locals": {"a": 1}}`},
			[]string{"reserved-name|kloud_docker.tf.json:1: file name kloud_docker.tf.json is not allowed (rule reserved-name)"}},
	} {
		t.Run(name, func(t *testing.T) {
			files := map[string][]byte{}
			for n, c := range tc.files {
				files[n] = []byte(c)
			}
			fs, err := tv.ValidateTemplate(t.Context(), files)
			if err != nil {
				t.Fatal(err)
			}
			if len(fs) != len(tc.want) {
				t.Fatalf("findings %v, want %q", fs, tc.want)
			}
			for i, f := range fs {
				rule, text, _ := strings.Cut(tc.want[i], "|")
				if f.Rule != rule || !strings.Contains(f.Error(), text) {
					t.Errorf("finding %d: %s %q, want %s %q", i, f.Rule, f.Error(), rule, text)
				}
			}
			if len(tc.want) == 0 {
				return
			}
			// ApplyTemplate (the build) refuses with the same words.
			b := &provider.BaseStack{Provider: p, StackID: "s", Template: &provider.Template{Files: files},
				Machines: []*provider.MachineSpec{{ID: "m", Label: "vm", Resource: "vm", Provider: docker.Name}}}
			bst, _ := p.Stack(b)
			_, err = bst.ApplyTemplate(t.Context(), nil)
			for _, w := range tc.want {
				if _, text, _ := strings.Cut(w, "|"); err == nil || !strings.Contains(err.Error(), text) {
					t.Errorf("ApplyTemplate: %v, want %q", err, text)
				}
			}
		})
	}
}
