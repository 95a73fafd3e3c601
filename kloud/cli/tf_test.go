package cli_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// TestTF drives a real terraformer (terraformertest) with `kloud tf plan|apply|destroy`.
func TestTF(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	dataDir := t.TempDir()
	stack := filepath.Join(t.TempDir(), "my stack")
	if err := os.Mkdir(stack, 0o700); err != nil {
		t.Fatal(err)
	}
	main := `
variable "n" {
  type    = number
  default = 1
}
resource "terraform_data" "r" {
  count = var.n
  input = "r-${count.index}"
}
output "count" { value = length(terraform_data.r) }
`
	if err := os.WriteFile(filepath.Join(stack, "main.tf"), []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stack, "notes.txt"), []byte("not terraform"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (code int, stdout, stderr string) {
		var out, errOut bytes.Buffer
		args = append(args, "--data-dir", dataDir, "--terraformer-url", env.URL)
		code = cli.Run(t.Context(), args, &out, &errOut)
		return code, out.String(), errOut.String()
	}

	// Without kloud's key the command says how to get one.
	code, _, stderr := run("tf", "plan", stack)
	if code == 0 || !strings.Contains(stderr, "kloud key create --username kloud --out "+filepath.Join(dataDir, kloud.KloudKeyFile)) {
		t.Fatalf("plan without a key: exit %d\n%s", code, stderr)
	}
	if err := kitekey.WriteFile(filepath.Join(dataDir, kloud.KloudKeyFile), env.KiteKey("kloud")); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := run("tf", "plan", stack)
	if code != 0 || !strings.Contains(stdout, "plan my-stack: succeeded") || !strings.Contains(stdout, "Plan: 1 to add") ||
		!strings.Contains(stdout, "create   terraform_data.r[0]") {
		t.Fatalf("plan: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	code, stdout, stderr = run("tf", "apply", stack, "--var", "n=3")
	if code != 0 || !strings.Contains(stdout, "apply my-stack: succeeded") || !strings.Contains(stdout, "count = 3") ||
		!strings.Contains(stdout, "terraform_data.r[2]") || !strings.Contains(stdout, "%] terraform_data.r[0]: Creation complete") {
		t.Fatalf("apply: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	// --json: the job on stdout, progress on stderr.
	code, stdout, stderr = run("tf", "apply", stack, "--json")
	var j tfapi.Job
	if code != 0 || json.Unmarshal([]byte(stdout), &j) != nil || j.Status != tfapi.StatusSucceeded || j.Result.Outputs["count"].Value != float64(3) {
		t.Fatalf("apply --json: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "job "+j.ID) {
		t.Errorf("apply --json: no progress on stderr:\n%s", stderr)
	}

	// A failing job: Terraform's diagnostic, exit 1.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "main.tf"), []byte("resource \"terraform_data\" \"x\" {\n  input = \n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ = run("tf", "apply", bad, "--content-id", "bad")
	if code == 0 || !strings.Contains(stdout, "main.tf:2") || !strings.Contains(stdout, "Invalid expression") {
		t.Fatalf("bad apply: exit %d\n%s", code, stdout)
	}

	// Destroy without DIR uses the stored files.
	code, stdout, stderr = run("tf", "destroy", "--content-id", "my-stack")
	if code != 0 || !strings.Contains(stdout, "3 destroyed") {
		t.Fatalf("destroy: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	// Another user's key is refused with a hint.
	other := filepath.Join(t.TempDir(), "alice.key")
	if err := kitekey.WriteFile(other, env.KiteKey("alice")); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = run("tf", "plan", stack, "--key", other)
	if code == 0 || !strings.Contains(stderr, "permission") || !strings.Contains(stderr, "--username kloud") {
		t.Fatalf("plan with alice's key: exit %d\n%s", code, stderr)
	}
}
