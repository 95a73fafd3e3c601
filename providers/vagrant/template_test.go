package vagrant

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kontrol/kontroltest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

const want = "http://127.0.0.1:7000"

const machineTF = `
resource "kloudvagrant_machine" "web" {
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
	p := g["provider"].(map[string]any)["kloudvagrant"].(map[string]any)
	if len(p) != 2 || p["endpoint"] != want || p["token"] != "${var.kloud_vagrant_token}" {
		t.Errorf("provider.kloudvagrant = %v, want endpoint %q and the token variable", p, want)
	}
	rp := g["terraform"].(map[string]any)["required_providers"].(map[string]any)["kloudvagrant"].(map[string]any)
	if rp["source"] != "kloud/kloudvagrant" || rp["version"] != "0.1.0" {
		t.Errorf("required_providers.kloudvagrant = %v", rp)
	}
	if _, err := tmpl.Parse(files); err != nil {
		t.Errorf("result does not parse: %s", err)
	}
}

// The provider block rewriting itself (an existing block replaced line for line, the user's
// required_providers kept, refusals) is tmpl.ConfigureProvider's, tested there and with the
// local provider; these tests check the vagrant provider's wiring.

// ApplyTemplate configures the provider with a token of the stack and its owner, which only the
// generated provider block may reference; with machines to build it first asks for the owner's
// host and says how to start one when there is none.
func TestApplyTemplateToken(t *testing.T) {
	ko := kontroltest.Start(t, kontroltest.Options{})
	v, err := New(Options{StateDir: t.TempDir(), Hosts: KontrolHosts(ko.Kontrol), Instance: "kloud-t", Endpoint: "http://127.0.0.1:7000"})
	if err != nil {
		t.Fatal(err)
	}
	stack := func(src string, machines ...*provider.MachineSpec) provider.Stack {
		st, err := v.Provider().Stack(&provider.BaseStack{Provider: v.Provider(), StackID: "st1", Owner: "alice", Machines: machines,
			Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(src)}, Variables: map[string]any{}}})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	apply := func(src string) (*provider.Template, error) { return stack(src).ApplyTemplate(t.Context(), nil) }
	tpl, err := apply(machineTF)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := tpl.Variables[TokenVar].(string)
	c, err := v.parseToken(tok, false)
	if err != nil || c.Stack != "st1" || c.Owner != "alice" || len(c.Machines) != 0 || c.Instance != "kloud-t" {
		t.Fatalf("token %q: %+v %v", tok, c, err)
	}
	for name, src := range map[string]string{
		"declared by the template": "variable \"kloud_vagrant_token\" {\n  sensitive = true\n}\n" + machineTF,
		"used in a resource":       "resource \"kloudvagrant_machine\" \"x\" {\n  hostname  = \"x\"\n  user_data = var.kloud_vagrant_token\n}\n",
		"used in an output":        machineTF + `output "t" { value = var.kloud_vagrant_token }`,
	} {
		if _, err := apply(src); err == nil || !strings.Contains(err.Error(), "main.tf:") || !strings.Contains(err.Error(), TokenVar) {
			t.Errorf("%s: %v, want an error naming main.tf and %s", name, err, TokenVar)
		}
	}
	// A build, but alice has no vagrant host connected.
	zero := 0
	_, err = stack(machineTF, &provider.MachineSpec{ID: "m1", Label: "web.0", Resource: "web", Index: &zero, Provider: Name, Owner: "alice"}).ApplyTemplate(t.Context(), nil)
	if !errors.Is(err, kite.ErrUnavailable) || !strings.Contains(err.Error(), "klient --vagrant") {
		t.Errorf("build without a host: %v", err)
	}
}
