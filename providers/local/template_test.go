package local

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
)

const want = "http://127.0.0.1:7000"

const machineTF = `
resource "kloudlocal_machine" "web" {
  count    = 2
  hostname = "web-${count.index}"
}
`

func generated(t *testing.T, files map[string][]byte) map[string]any {
	t.Helper()
	var g map[string]any
	if err := json.Unmarshal(files[GeneratedFile], &g); err != nil {
		t.Fatalf("%s: %s\n%s", GeneratedFile, err, files[GeneratedFile])
	}
	return g
}

func TestConfigureProviderWithoutBlock(t *testing.T) {
	files, err := configureProvider(map[string][]byte{"main.tf": []byte(machineTF)}, want)
	if err != nil {
		t.Fatal(err)
	}
	if string(files["main.tf"]) != machineTF {
		t.Errorf("main.tf changed:\n%s", files["main.tf"])
	}
	g := generated(t, files)
	p := g["provider"].(map[string]any)["kloudlocal"].(map[string]any)
	if len(p) != 2 || p["endpoint"] != want || p["token"] != "${var.kloud_local_token}" {
		t.Errorf("provider.kloudlocal = %v, want endpoint %q and the token variable", p, want)
	}
	rp := g["terraform"].(map[string]any)["required_providers"].(map[string]any)["kloudlocal"].(map[string]any)
	if rp["source"] != "kloud/kloudlocal" || rp["version"] != "0.1.0" {
		t.Errorf("required_providers.kloudlocal = %v", rp)
	}
	if _, err := tmpl.Parse(files); err != nil {
		t.Errorf("result does not parse: %s", err)
	}
}

// An empty block is replaced (keeping line numbers); the user's
// own required_providers entry is kept and not declared twice.
func TestConfigureProviderReplacesBlock(t *testing.T) {
	src := `terraform {
  required_providers {
    kloudlocal = { source = "registry.terraform.io/kloud/kloudlocal" }
  }
}

provider "kloudlocal" {

}
` + machineTF
	files, err := configureProvider(map[string][]byte{"main.tf": []byte(src)}, want)
	if err != nil {
		t.Fatal(err)
	}
	got := string(files["main.tf"])
	if strings.Contains(got, `provider "kloudlocal" {`) || !strings.Contains(got, `# provider "kloudlocal": configured by kloud in kloud_local.tf.json`) {
		t.Errorf("provider block not replaced:\n%s", got)
	}
	if strings.Count(got, "\n") != strings.Count(src, "\n") {
		t.Errorf("line count changed: %d, was %d", strings.Count(got, "\n"), strings.Count(src, "\n"))
	}
	if _, ok := generated(t, files)["terraform"]; ok {
		t.Errorf("required_providers declared twice:\n%s", files[GeneratedFile])
	}

	js := `{"provider": [{"kloudlocal": {}}, {"local": {}}], "resource": {"kloudlocal_machine": {"a": {"hostname": "a", "user_data": "<x & y>"}}}}`
	files, err = configureProvider(map[string][]byte{"main.tf.json": []byte(js)}, want)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(files["main.tf.json"], &top); err != nil {
		t.Fatal(err)
	}
	if prov, _ := json.Marshal(top["provider"]); string(prov) != `[{"local":{}}]` {
		t.Errorf("JSON provider after removal: %s", prov)
	}
	if ud := top["resource"].(map[string]any)["kloudlocal_machine"].(map[string]any)["a"].(map[string]any)["user_data"]; ud != "<x & y>" {
		t.Errorf("user_data changed: %q", ud)
	}
}

func TestConfigureProviderRefuses(t *testing.T) {
	for name, src := range map[string]string{
		"state dir":     `provider "kloudlocal" { state_dir = "/elsewhere" }`,
		"endpoint":      `provider "kloudlocal" { endpoint = "http://127.0.0.1:7000" }`,
		"token":         "variable \"t\" {}\nprovider \"kloudlocal\" { token = var.t }",
		"not a literal": "variable \"b\" {}\nprovider \"kloudlocal\" { bridge = var.b }",
		"alias":         `provider "kloudlocal" { alias = "two" }`,
		"wrong source":  "terraform {\n  required_providers {\n    kloudlocal = { source = \"hashicorp/kloudlocal\" }\n  }\n}",
		"no source":     "terraform {\n  required_providers {\n    kloudlocal = \"0.1.0\"\n  }\n}",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := configureProvider(map[string][]byte{"main.tf": []byte(src + machineTF)}, want)
			if err == nil || !strings.Contains(err.Error(), "main.tf:") || strings.Contains(err.Error(), "Argument definition required") {
				t.Fatalf("got %v, want an error naming main.tf:line", err)
			}
			t.Log(err)
		})
	}
}

func TestSetTags(t *testing.T) {
	i0, i1 := 0, 1
	tf := `resource "kloudlocal_machine" "web" {
  count    = 2
  hostname = "web-${count.index}"
  tags     = { team = "a", kloud_stack = "overridden" }
}

resource "kloudlocal_machine" "db" {
  hostname = "db"
}
`
	s := (&Local{}).newStack(&provider.BaseStack{
		StackID:  "st1",
		Team:     "t1",
		Owner:    "alice",
		Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(tf)}, Variables: map[string]any{}},
		Machines: []*provider.MachineSpec{
			{ID: "m1", Label: "web.1", Resource: "web", Index: &i1},
			{ID: "m0", Label: "web.0", Resource: "web", Index: &i0},
			{ID: "m2", Label: "db", Resource: "db"},
		},
	})
	if err := s.setTags(); err != nil {
		t.Fatal(err)
	}
	got := string(s.B.Template.Files["main.tf"])
	for _, w := range []string{
		`team = "a", kloud_stack = var.kloud_local_stack_web[count.index]`,
		`kloud_machine = var.kloud_local_machine_web[count.index]`,
		`kloud_stack = var.kloud_local_stack_db`,
		`kloud_machine = var.kloud_local_machine_db`,
		`kloud_team = var.kloud_local_team_web[count.index]`,
		`kloud_owner = var.kloud_local_owner_db`,
	} {
		if !strings.Contains(got, w) {
			t.Errorf("main.tf lacks %q:\n%s", w, got)
		}
	}
	v := s.B.Template.Variables
	if m, _ := json.Marshal(v); string(m) != `{"kloud_local_machine_db":"m2","kloud_local_machine_web":["m0","m1"],"kloud_local_owner_db":"alice","kloud_local_owner_web":["alice","alice"],"kloud_local_stack_db":"st1","kloud_local_stack_web":["st1","st1"],"kloud_local_team_db":"t1","kloud_local_team_web":["t1","t1"]}` {
		t.Errorf("variables: %s", m)
	}
	if _, ok := s.B.Template.Files[tmpl.GeneratedFile]; !ok {
		t.Error("variables not declared")
	}
}

// Real terraform accepts the rewritten template: the generated provider configuration, the user's
// own terraform block beside the generated one, and the tag variables (validate needs no root).
func TestRewrittenTemplateValidates(t *testing.T) {
	tf, cliConfig := tfprovidertest.Terraform(t)
	i0, i1 := 0, 1
	src := `terraform {
  required_version = ">= 1.1"
}

provider "kloudlocal" {}

resource "kloudlocal_machine" "web" {
  count     = 2
  hostname  = "web-${count.index}"
  user_data = "#cloud-config\n{}\n"
}
`
	s := (&Local{}).newStack(&provider.BaseStack{
		StackID:  "st1",
		Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(src)}, Variables: map[string]any{}},
		Machines: []*provider.MachineSpec{
			{ID: "m0", Label: "web.0", Resource: "web", Index: &i0},
			{ID: "m1", Label: "web.1", Resource: "web", Index: &i1},
		},
	})
	if err := s.setTags(); err != nil {
		t.Fatal(err)
	}
	cfg, err := tmpl.Parse(s.B.Template.Files)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.DeclareVariable(TokenVar, "string", true); err != nil {
		t.Fatal(err)
	}
	files, err := configureProvider(cfg.Files(), want)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "TF_CLI_CONFIG_FILE="+cliConfig, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")
	for _, args := range [][]string{{"init", "-input=false", "-no-color"}, {"validate", "-no-color"}} {
		cmd := exec.Command(tf, args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("terraform %s: %s\n%s\nfiles: %s", args[0], err, out, files)
		}
	}
}

// ApplyTemplate hands the stack's token to the generated provider block only, as a sensitive
// variable; a template may neither declare that variable nor use it anywhere else.
func TestApplyTemplateToken(t *testing.T) {
	testutil.RequireRoot(t)
	if err := sandbox.Available(); err != nil {
		testutil.Unavailable(t, "%s", err)
	}
	l, err := New(Options{StateDir: t.TempDir(), BaseImage: "/nonexistent", Instance: "kloud-t", Endpoint: "http://127.0.0.1:7000"})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(src string) (*provider.Template, error) {
		st, err := l.Provider().Stack(&provider.BaseStack{Provider: l.Provider(), StackID: "st1",
			Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(src)}, Variables: map[string]any{}}})
		if err != nil {
			t.Fatal(err)
		}
		return st.ApplyTemplate(t.Context(), nil)
	}
	tpl, err := apply(machineTF)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := tpl.Variables[TokenVar].(string)
	c, err := l.parseToken(tok, false)
	if err != nil || c.Stack != "st1" || len(c.Machines) != 0 || c.Instance != "kloud-t" {
		t.Fatalf("token %q: %+v %v", tok, c, err)
	}
	cfg, err := tmpl.Parse(tpl.Files)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range cfg.Variables() {
		if v.Name == TokenVar {
			found = v.Sensitive && v.File == tmpl.GeneratedFile
		}
	}
	if !found {
		t.Errorf("%s is not declared sensitive in %s:\n%s", TokenVar, tmpl.GeneratedFile, tpl.Files[tmpl.GeneratedFile])
	}
	for name, src := range map[string]string{
		"declared by the template": "variable \"kloud_local_token\" {\n  sensitive = true\n}\n" + machineTF,
		"used in a resource":       "resource \"kloudlocal_machine\" \"x\" {\n  hostname  = \"x\"\n  user_data = var.kloud_local_token\n}\n",
		"used in an output":        machineTF + `output "t" { value = var.kloud_local_token }`,
	} {
		if _, err := apply(src); err == nil || !strings.Contains(err.Error(), "main.tf:") || !strings.Contains(err.Error(), TokenVar) {
			t.Errorf("%s: %v, want an error naming main.tf and %s", name, err, TokenVar)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
