package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// TestParamsFromTheCLI: kloud template parameters lists a template's typed parameters and
// presets (a table; --json camelCase); stack create --param types each value as the template
// says (a number, a list), --preset picks a preset ("" none), and kloud's refusal of a value
// carries the variable's own error_message. A real kloud and terraform.
func TestParamsFromTheCLI(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	machines := filepath.Join(t.TempDir(), "machines")
	reg.Register(dummy.New(dummy.Options{Dir: machines}))
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg})
	t.Cleanup(func() { dummy.KillAll(context.Background(), machines) })
	e.StartTerraformerWith(tfrun.Options{Dir: filepath.Join(t.TempDir(), "terraformer")})
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	must(run("key", "create", "--username", "alice", "--out", aliceKey))
	alice := func(args ...string) (int, string, string) { return run(append(args, "--key", aliceKey)...) }
	if _, err := e.Client("alice").CredentialAdd(t.Context(), api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"s3cret-token"}`)}); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(t.TempDir(), "main.tf")
	if err := os.WriteFile(main, []byte(testutil.ModuleFile(t, "provider/tmpl/testdata/params.tf")), 0o600); err != nil {
		t.Fatal(err)
	}
	var tmpl struct{ ID string }
	if err := json.Unmarshal([]byte(must(alice("template", "create", "--title", "p", "--file", main, "--json"))), &tmpl); err != nil {
		t.Fatal(err)
	}
	out := must(alice("template", "parameters", tmpl.ID))
	t.Logf("template parameters:\n%s", out)
	for _, want := range []string{"NAME", "size", "Machine size: How big the machine is", `"small","large"`, "list(string)", "PRESET", `{"cpus":4,"size":"large"}`, "(sensitive)"} {
		if !strings.Contains(out, want) {
			t.Errorf("template parameters lacks %q:\n%s", want, out)
		}
	}
	js := must(alice("template", "parameters", tmpl.ID, "--json"))
	if !strings.Contains(js, `"displayName": "Machine size"`) || !strings.Contains(js, `"presets"`) {
		t.Errorf("template parameters --json:\n%s", js)
	}

	code, _, stderr := alice("stack", "create", "--template", tmpl.ID, "--param", "cpus=9", "--param", "api_key=k3y")
	if code == 0 || !strings.Contains(stderr, `parameter "cpus": A machine has 1 to 4 CPUs.`) {
		t.Errorf("an invalid value: exit %d, %s", code, stderr)
	}
	code, _, stderr = alice("stack", "create", "--template", tmpl.ID, "--param", "colour=red")
	if code == 0 || !strings.Contains(stderr, `has no parameter "colour"`) {
		t.Errorf("an unknown parameter: exit %d, %s", code, stderr)
	}
	var created api.StackCreateResult
	if err := json.Unmarshal([]byte(must(alice("stack", "create", "--template", tmpl.ID, "--param", "cpus=3", "--param", `tags=["a","b"]`, "--param", "api_key=k3y", "--json"))), &created); err != nil {
		t.Fatal(err)
	}
	if v := created.Stack.Variables; created.Stack.Preset != "big" || v["size"] != "large" || v["cpus"] != "3" || v["tags"] != `["a","b"]` {
		t.Errorf("stack create: preset %q, variables %v", created.Stack.Preset, v)
	}
	if code, _, stderr := alice("stack", "update", created.Stack.ID, "--param", "cpus=2", "--plan"); code == 0 || !strings.Contains(stderr, "leave out one of them") {
		t.Errorf("stack update --param --plan: exit %d, %s", code, stderr)
	}
	// Never built: an update (of parameters too) is refused, saying how to build it.
	if code, _, stderr := alice("stack", "update", created.Stack.ID, "--param", "cpus=2"); code == 0 || !strings.Contains(stderr, "was never built") {
		t.Errorf("stack update --param of a stack never built: exit %d, %s", code, stderr)
	}
	var plain api.StackCreateResult
	if err := json.Unmarshal([]byte(must(alice("stack", "create", "--template", tmpl.ID, "--preset", "", "--param", "api_key=k3y", "--json"))), &plain); err != nil {
		t.Fatal(err)
	}
	if plain.Stack.Preset != "" || len(plain.Stack.Variables) != 0 {
		t.Errorf("--preset \"\": preset %q, variables %v", plain.Stack.Preset, plain.Stack.Variables)
	}
}
