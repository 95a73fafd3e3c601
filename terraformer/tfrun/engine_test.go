package tfrun_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

const jobTimeout = 2 * time.Minute

func submit(t *testing.T, e *tfrun.Engine, req tfrun.Request) *tfrun.Job {
	t.Helper()
	j, err := e.Submit(t.Context(), req)
	if err != nil {
		t.Fatalf("submit %s %s: %v", req.Op, req.ContentID, err)
	}
	return j
}

// run submits and waits; it fails the test unless the job ends with want.
func run(t *testing.T, e *tfrun.Engine, req tfrun.Request, want tfrun.Status) *tfrun.Job {
	t.Helper()
	j := tfruntest.Wait(t, e, submit(t, e, req).ID, jobTimeout)
	if j.Status != want {
		t.Fatalf("%s %s: status %s, want %s; error: %v\nlog:\n%s", req.Op, req.ContentID, j.Status, want, j.Err(),
			strings.Join(j.Log, "\n"))
	}
	return j
}

func files(main string) map[string][]byte { return map[string][]byte{"main.tf": []byte(main)} }

func addresses(rs []tfrun.StateResource) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Address)
	}
	return out
}

// gate is a local-exec command that records its pid, touches <dir>/started and then waits until
// <dir>/release exists (at most ~5 minutes). A terraform_data with it stays "creating" until the
// test lets it go, with no sleep in the test itself.
func gate(dir string) string {
	return fmt.Sprintf(`echo $$ > %[1]s/pid; touch %[1]s/started; i=0; while [ ! -f %[1]s/release ] && [ $i -lt 6000 ]; do i=$((i+1)); sleep 0.05; done`, dir)
}

const stackWithGate = `
resource "terraform_data" "fast" {
  count = 2
  input = "fast-${count.index}"
}
resource "terraform_data" "slow" {
  depends_on = [terraform_data.fast]
  input      = "slow"
  provisioner "local-exec" {
    command = %q
  }
}
`

func waitFile(t *testing.T, path string) {
	t.Helper()
	testutil.Eventually(t, time.Minute, func() bool {
		_, err := os.Stat(path)
		return err == nil
	}, "%s never appeared", path)
}

func release(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestPlanApplyDestroy(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	out := filepath.Join(t.TempDir(), "hello.txt")
	main := fmt.Sprintf(`
variable "n" {
  type    = number
  default = 3
}
resource "terraform_data" "a" {
  count = var.n
  input = "a-${count.index}"
}
resource "local_file" "f" {
  content  = "hello ${var.n}"
  filename = %q
}
output "ids" { value = terraform_data.a[*].id }
output "secret" {
  value     = "s3cret"
  sensitive = true
}
`, out)
	ctx := t.Context()

	plan := run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: "round-trip", Files: files(main), TraceID: "trace-1"}, tfrun.StatusSucceeded)
	if plan.Result == nil || len(plan.Result.Changes) != 4 || plan.Result.Summary.Add != 4 {
		t.Fatalf("plan result: %+v", plan.Result)
	}
	for _, c := range plan.Result.Changes {
		if !slices.Equal(c.Actions, []string{"create"}) {
			t.Errorf("%s: actions %v, want [create]", c.Address, c.Actions)
		}
		if c.Address == "local_file.f" {
			after, _ := c.After.(map[string]any)
			if after["content"] != "hello 3" || c.Provider != "registry.terraform.io/hashicorp/local" {
				t.Errorf("local_file.f planned %+v provider %s", after, c.Provider)
			}
		}
	}
	if plan.TraceID != "trace-1" || plan.Percent != 100 {
		t.Errorf("plan job: trace %q percent %d", plan.TraceID, plan.Percent)
	}
	if _, err := e.State(ctx, "round-trip"); !errors.Is(err, tfrun.ErrNotFound) {
		t.Errorf("state after plan only: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("plan created the file")
	}

	// Apply with no files: the stored content is used.
	apply := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "round-trip"}, tfrun.StatusSucceeded)
	if apply.Planned != 4 || apply.Completed != 4 || apply.Percent != 100 {
		t.Errorf("apply progress: planned %d completed %d percent %d", apply.Planned, apply.Completed, apply.Percent)
	}
	for _, r := range apply.Resources {
		if r.Status != tfrun.ResourceComplete || r.Action != "create" {
			t.Errorf("resource progress %+v", r)
		}
	}
	want := []string{"local_file.f", "terraform_data.a[0]", "terraform_data.a[1]", "terraform_data.a[2]"}
	if got := addresses(apply.Result.Resources); !slices.Equal(got, want) {
		t.Fatalf("state resources %v, want %v", got, want)
	}
	if apply.Result.Summary.Add != 4 {
		t.Errorf("apply summary %+v", apply.Result.Summary)
	}
	if o := apply.Result.Outputs["secret"]; !o.Sensitive || o.Value != "s3cret" {
		t.Errorf("secret output %+v", o)
	}
	if ids, _ := apply.Result.Outputs["ids"].Value.([]any); len(ids) != 3 {
		t.Errorf("ids output %+v", apply.Result.Outputs["ids"])
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "hello 3" {
		t.Fatalf("local_file: %q, %v", b, err)
	}
	outputs, err := e.Outputs(ctx, "round-trip")
	if err != nil || outputs["secret"] != "s3cret" {
		t.Fatalf("outputs %v, %v", outputs, err)
	}

	// Nothing changed: an empty plan.
	again := run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: "round-trip"}, tfrun.StatusSucceeded)
	if len(again.Result.Changes) != 0 {
		t.Fatalf("second plan: %+v", again.Result.Changes)
	}

	// A variable shrinks the stack and rewrites the file.
	shrink := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "round-trip", Variables: map[string]any{"n": 1}}, tfrun.StatusSucceeded)
	if s := shrink.Result.Summary; s.Remove != 3 || s.Add != 1 {
		t.Errorf("shrink summary %+v", s) // 2 removed + local_file replaced
	}
	if b, _ := os.ReadFile(out); string(b) != "hello 1" {
		t.Errorf("file after shrink: %q", b)
	}

	// Destroy reuses files and variables.
	destroy := run(t, e, tfrun.Request{Op: tfrun.OpDestroy, ContentID: "round-trip"}, tfrun.StatusSucceeded)
	if len(destroy.Result.Resources) != 0 || destroy.Result.Summary.Remove != 2 {
		t.Errorf("destroy result %+v", destroy.Result)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("destroy left the file")
	}
	st, err := e.State(ctx, "round-trip")
	if err != nil {
		t.Fatal(err)
	}
	if st.Values != nil && st.Values.RootModule != nil && len(st.Values.RootModule.Resources) != 0 {
		t.Errorf("state after destroy: %+v", st.Values.RootModule.Resources)
	}
}
