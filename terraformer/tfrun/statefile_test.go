package tfrun_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// stateConfig has what kloud's states have and more: count and for_each instances (the dummy
// provider's terraform_data machines), a sensitive variable inside an object, a provider's
// schema-sensitive attribute (hashicorp/local's sensitive_content), a data source, dependencies,
// a module with count, and plain, sensitive and object outputs.
const stateConfig = `terraform {
  required_providers {
    local = { source = "hashicorp/local", version = "%s" }
  }
}
variable "secret" {
  default   = "s3cret"
  sensitive = true
}
resource "terraform_data" "c" {
  count = 2
  input = { a = count.index, l = [1, 2], s = var.secret, m = { k = "v" } }
}
resource "terraform_data" "f" {
  for_each   = toset(["k1", "k.2"])
  input      = each.key
  depends_on = [terraform_data.c]
}
resource "local_file" "lf" {
  filename          = "${path.module}/out.txt"
  sensitive_content = "hidden"
}
data "local_file" "d" {
  filename = "${path.module}/m/m.tf"
}
module "mm" {
  count  = 2
  source = "./m"
  x      = "y${count.index}"
}
output "plain" { value = "p" }
output "sec" {
  value     = var.secret
  sensitive = true
}
output "obj" { value = { n = 1.5, l = ["a"], big = 12345678901234567890 } }
`

const stateModule = `variable "x" {}
resource "terraform_data" "in" { input = var.x }
module "inner" {
  source = "./n"
}
output "o" { value = terraform_data.in.output }
`

// terraformCLI runs the terraform of the test setup (the provider mirror, no checkpoint) in a
// directory, outside the engine: what the state file is compared with.
type terraformCLI struct {
	tf  string
	env []string
}

func newTerraformCLI(tb testing.TB) terraformCLI {
	tf, cliConfig := tfruntest.Setup(tb)
	return terraformCLI{tf: tf, env: append(os.Environ(), "TF_CLI_CONFIG_FILE="+cliConfig, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1")}
}

// run runs terraform args in dir and returns its standard output; it fails tb on an error.
func (c terraformCLI) run(tb testing.TB, dir string, args ...string) []byte {
	tb.Helper()
	cmd := exec.Command(c.tf, args...)
	cmd.Dir, cmd.Env = dir, c.env
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		tb.Fatalf("terraform %v: %v\n%s%s", args, err, out, stderr)
	}
	return out
}

// capturedStates are the states captured from real kloud runs (testdata/states/<name>.tfstate,
// user data redacted) and the provider each needs from the mirror.
var capturedStates = []struct{ name, source, version string }{
	{"docker", "kreuzwerker/docker", "4.6.0"},
	{"kloudlocal", "kloud/kloudlocal", "0.1.0"},
}

// capturedDir makes a directory holding the captured state name and a main.tf requiring its
// provider, initialised; "" when the provider is not in the mirror (the caller says so).
func (c terraformCLI) capturedDir(tb testing.TB, name, source, version string) string {
	tb.Helper()
	if _, err := os.Stat(filepath.Join(tfruntest.Cache(), "tf-mirror", "registry.terraform.io", source, version)); err != nil {
		return ""
	}
	dir := tb.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", "states", name+".tfstate"))
	if err != nil {
		tb.Fatal(err)
	}
	main := fmt.Sprintf("terraform {\n  required_providers {\n    %s = { source = %q, version = %q }\n  }\n}\n", name, source, version)
	if err := os.WriteFile(filepath.Join(dir, "main.tf"), []byte(main), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "terraform.tfstate"), src, 0o600); err != nil {
		tb.Fatal(err)
	}
	c.run(tb, dir, "init", "-input=false", "-no-color")
	return dir
}

// The engine reads the state file itself instead of running `terraform show -json` (which starts
// every provider again): both must give the same JSON, on real states of every kind kloud makes:
// a live one (terraform_data as the dummy provider's machines, hashicorp/local, modules,
// sensitive values, a tainted instance, an empty state after destroy) and states captured from
// real kloud runs of the docker provider (kreuzwerker/docker) and the local provider
// (kloud/kloudlocal), user data redacted (testdata/states). It also refuses what the sandboxed
// terraform could plant: a symlink, a file of another owner, another state version.
func TestStateFileMatchesShow(t *testing.T) {
	cli := newTerraformCLI(t)
	compare := func(t *testing.T, dir string, owner int) {
		t.Helper()
		var show, direct any
		if err := json.Unmarshal(cli.run(t, dir, "show", "-json"), &show); err != nil {
			t.Fatal(err)
		}
		raw, err := tfrun.ReadStateFile(filepath.Join(dir, "terraform.tfstate"), owner)
		if err != nil {
			t.Fatalf("read the state file: %v", err)
		}
		if err := json.Unmarshal(raw, &direct); err != nil {
			t.Fatal(err)
		}
		// show prints its own binary's version, the file the version that wrote it.
		for _, v := range []any{show, direct} {
			delete(v.(map[string]any), "terraform_version")
		}
		if !reflect.DeepEqual(show, direct) {
			a, _ := json.MarshalIndent(show, "", " ")
			b, _ := json.MarshalIndent(direct, "", " ")
			t.Errorf("the state file read directly differs from terraform show -json:\n%s", lineDiff(string(a), string(b)))
		}
	}

	t.Run("live", func(t *testing.T) {
		dir := t.TempDir()
		for name, src := range map[string]string{
			"main.tf":   fmt.Sprintf(stateConfig, tfruntest.LocalProviderVersion),
			"m/m.tf":    stateModule,
			"m/n/n.tf":  `resource "terraform_data" "deep" { input = "d" }`,
			"unused.tf": "",
		} {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cli.run(t, dir, "init", "-input=false", "-no-color")
		cli.run(t, dir, "apply", "-auto-approve", "-input=false", "-no-color")
		compare(t, dir, os.Getuid())
		cli.run(t, dir, "taint", `terraform_data.f["k.2"]`)
		compare(t, dir, os.Getuid())
		cli.run(t, dir, "destroy", "-auto-approve", "-input=false", "-no-color")
		compare(t, dir, os.Getuid())
	})

	for _, p := range capturedStates {
		t.Run(p.name, func(t *testing.T) {
			dir := cli.capturedDir(t, p.name, p.source, p.version)
			if dir == "" {
				testutil.Unavailable(t, "%s %s is not in the provider mirror (scripts/tf-mirror.sh, scripts/build-docker-provider.sh)", p.source, p.version)
			}
			compare(t, dir, os.Getuid())
		})
	}

	// The engine after an apply: no show (the state file read directly), the job's result and
	// state.json as show gives them.
	t.Run("engine", func(t *testing.T) {
		cmds := &cmdLog{mu: &sync.Mutex{}, cmds: &[]string{}}
		e := tfruntest.NewEngine(t, tfrun.Options{Logger: slog.New(cmds)})
		main := fmt.Sprintf(stateConfig, tfruntest.LocalProviderVersion)
		main = strings.ReplaceAll(main, "module \"mm\" {\n  count  = 2\n  source = \"./m\"\n  x      = \"y${count.index}\"\n}\n", "")
		main = strings.ReplaceAll(main, "${path.module}/m/m.tf", "${path.module}/main.tf")
		j := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "statefile", Files: files(main)}, tfrun.StatusSucceeded)
		if got := cmds.get(); slices.Contains(got, "show") || !slices.Contains(got, "apply") {
			t.Errorf("terraform commands of the apply: %v, want no show", got)
		}
		if j.Result == nil || len(j.Result.Resources) != 6 || j.Result.Outputs["sec"].Value != "s3cret" || !j.Result.Outputs["sec"].Sensitive {
			t.Fatalf("apply result: %+v", j.Result)
		}
		for _, r := range j.Result.Resources {
			if r.Address == "terraform_data.c[1]" && r.Values["input"].(map[string]any)["s"] != "s3cret" {
				t.Errorf("terraform_data.c[1] values %v", r.Values)
			}
		}
		compare(t, tfruntest.WorkDir(e, "statefile"), -1) // the sandbox user's
		snap, err := os.ReadFile(filepath.Join(filepath.Dir(tfruntest.WorkDir(e, "statefile")), "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := tfrun.ReadStateFile(filepath.Join(tfruntest.WorkDir(e, "statefile"), "terraform.tfstate"), -1)
		if err != nil || string(raw) != string(snap) {
			t.Errorf("state.json is not the state file's show JSON: %v", err)
		}
	})

	t.Run("hostile", func(t *testing.T) {
		dir := t.TempDir()
		state := filepath.Join(dir, "terraform.tfstate")
		secret := filepath.Join(t.TempDir(), "secret.tfstate")
		good := `{"version":4,"terraform_version":"1.11.4","outputs":{"o":{"value":"x","type":"string"}},"resources":[]}`
		if err := os.WriteFile(secret, []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(secret, state); err != nil {
			t.Fatal(err)
		}
		if _, err := tfrun.ReadStateFile(state, os.Getuid()); err == nil {
			t.Error("a symlinked state file was read")
		}
		os.Remove(state)
		if err := os.Link(secret, state); err != nil {
			t.Fatal(err)
		}
		if _, err := tfrun.ReadStateFile(state, os.Getuid()+1); err == nil || !strings.Contains(err.Error(), "not the sandbox user's") {
			t.Errorf("a state file of another owner: %v", err)
		}
		if _, err := tfrun.ReadStateFile(state, os.Getuid()); err != nil {
			t.Errorf("the owner's state file: %v", err)
		}
		os.Remove(state)
		for name, src := range map[string]string{
			"version 3":      `{"version":3,"modules":[]}`,
			"not json":       `{"version":4,`,
			"bad provider":   `{"version":4,"resources":[{"mode":"managed","type":"t","name":"n","provider":"x","instances":[{"attributes":{}}]}]}`,
			"bad mode":       `{"version":4,"resources":[{"mode":"other","type":"t","name":"n","provider":"provider[\"a/b\"]","instances":[]}]}`,
			"bad path":       `{"version":4,"resources":[{"mode":"managed","type":"t","name":"n","provider":"provider[\"a/b\"]","instances":[{"attributes":{},"sensitive_attributes":[[{"type":"x"}]]}]}]}`,
			"flatmap (0.11)": `{"version":4,"resources":[{"mode":"managed","type":"t","name":"n","provider":"provider[\"a/b\"]","instances":[{"attributes_flat":{"id":"x"}}]}]}`,
			"check results":  `{"version":4,"resources":[],"check_results":[{"object_kind":"check","config_addr":"check.c","status":"pass"}]}`,
			"a directory":    "",
		} {
			if name == "a directory" {
				os.Mkdir(state, 0o700)
			} else if err := os.WriteFile(state, []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := tfrun.ReadStateFile(state, os.Getuid()); err == nil {
				t.Errorf("%s: read without an error", name)
			}
			os.RemoveAll(state)
		}
	})
}

// lineDiff shows the lines of a and b that differ (the first 40).
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for i := 0; i < max(len(al), len(bl)) && len(out) < 40; i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			out = append(out, fmt.Sprintf("%d: show   %s\n%d: direct %s", i+1, x, i+1, y))
		}
	}
	return strings.Join(out, "\n")
}

// cmdLog records the terraform commands the engine starts (exec.go's "terraform starting").
type cmdLog struct {
	mu    *sync.Mutex
	cmds  *[]string
	attrs []slog.Attr
}

func (h *cmdLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *cmdLog) WithGroup(string) slog.Handler            { return h }
func (h *cmdLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &cmdLog{mu: h.mu, cmds: h.cmds, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h *cmdLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "terraform starting" {
		return nil
	}
	for _, a := range h.attrs {
		if a.Key == "cmd" {
			h.mu.Lock()
			*h.cmds = append(*h.cmds, a.Value.String())
			h.mu.Unlock()
		}
	}
	return nil
}

func (h *cmdLog) get() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(*h.cmds)
}

// BenchmarkStateRead is what an apply of a docker stack pays to read its state: `terraform show
// -json` (which starts the 76 MB Docker provider for its schema; the engine ran it after every
// apply and destroy) vs reading the state file (what the engine does now), on the captured states.
//
//	set -a; . /var/cache/kloud/env; set +a; go test ./terraformer/tfrun -run '^$' -bench StateRead -benchtime 5x
func BenchmarkStateRead(b *testing.B) {
	cli := newTerraformCLI(b)
	for _, p := range capturedStates {
		dir := cli.capturedDir(b, p.name, p.source, p.version)
		if dir == "" {
			b.Logf("%s is not in the mirror: skipped", p.source)
			continue
		}
		b.Run(p.name+"/show", func(b *testing.B) {
			for b.Loop() {
				cli.run(b, dir, "show", "-json")
			}
		})
		b.Run(p.name+"/direct", func(b *testing.B) {
			for b.Loop() {
				if _, err := tfrun.ReadStateFile(filepath.Join(dir, "terraform.tfstate"), os.Getuid()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
