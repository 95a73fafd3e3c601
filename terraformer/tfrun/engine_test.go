package tfrun_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
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

// gate is a local-exec command that records its pid, touches <dir>/started and then waits until
// <dir>/release exists (at most ~5 minutes). A terraform_data with it stays "creating" until the
// test lets it go, with no sleep in the test itself. dir must be the stack's work dir
// (tfruntest.WorkDir): nothing else of the host is writable in terraform's sandbox.
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
	out := filepath.Join(tfruntest.WorkDir(e, "round-trip"), "hello.txt")
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
  filename = "${path.module}/hello.txt"
}
output "ids" { value = terraform_data.a[*].id }
output "secret" {
  value     = "s3cret"
  sensitive = true
}
`)
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
	if got := tfruntest.Addresses(apply.Result.Resources); !slices.Equal(got, want) {
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

func TestWatchEvents(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	j := submit(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "watch", Files: files(`
resource "terraform_data" "r" {
  count = 5
  input = count.index
}`)})
	ch, err := e.Watch(t.Context(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	var evs []tfrun.Event
	for ev := range ch { // closes after the final event
		evs = append(evs, ev)
	}
	if len(evs) < 2 || (evs[0].Type != tfrun.EventJob && evs[0].Type != tfrun.EventFinal) {
		t.Fatalf("first event %+v", evs[0])
	}
	last := evs[len(evs)-1]
	if last.Type != tfrun.EventFinal || last.Job.Status != tfrun.StatusSucceeded || last.Percent != 100 {
		t.Fatalf("last event %+v", last)
	}
	if evs[0].Type == tfrun.EventFinal {
		return // the job was done before Watch: nothing else to see
	}
	completed := map[string]bool{}
	percent := 0
	for _, ev := range evs {
		if ev.Percent < percent {
			t.Errorf("percent went back from %d to %d", percent, ev.Percent)
		}
		percent = ev.Percent
		if ev.Type == tfrun.EventProgress && ev.Resource.Status == tfrun.ResourceComplete {
			completed[ev.Resource.Address] = true
		}
	}
	if len(completed) != 5 {
		t.Errorf("complete events for %v, want 5 resources", completed)
	}
	// A watch after the end gets the final job at once.
	ch, err = e.Watch(t.Context(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-ch; ev.Type != tfrun.EventFinal || ev.Job.ID != j.ID {
		t.Fatalf("late watch: %+v", ev)
	}
}

// TestParallelContentIDs proves that runs on different content ids overlap: each run's provisioner
// sleeps 3s (the sandboxes cannot see each other, so there is no barrier between them), and every
// run must have started before every other one finished.
func TestParallelContentIDs(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	names := []string{"par-a", "par-b", "par-c"}
	var ids []string
	for _, n := range names {
		j := submit(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: n, Files: files(`
resource "terraform_data" "barrier" {
  provisioner "local-exec" {
    command = "sleep 3"
  }
}`)})
		ids = append(ids, j.ID)
	}
	var jobs []*tfrun.Job
	for _, id := range ids {
		j := tfruntest.Wait(t, e, id, jobTimeout)
		if j.Status != tfrun.StatusSucceeded {
			t.Fatalf("%s: %s: %v", j.ContentID, j.Status, j.Err())
		}
		jobs = append(jobs, j)
	}
	for _, a := range jobs {
		for _, b := range jobs {
			if !a.StartedAt.Before(b.FinishedAt) {
				t.Errorf("%s started %s, after %s finished %s", a.ContentID, a.StartedAt, b.ContentID, b.FinishedAt)
			}
		}
	}
}

func TestSameContentLocked(t *testing.T) {
	t.Parallel()
	engineDir := t.TempDir()
	e := tfruntest.NewEngine(t, tfrun.Options{Dir: engineDir})
	dir := tfruntest.WorkDir(e, "locked")
	// A second engine on the same Dir stands for a second terraformer process.
	other := tfruntest.NewEngine(t, tfrun.Options{Dir: engineDir})
	t.Cleanup(func() { os.WriteFile(filepath.Join(dir, "release"), nil, 0o600) })

	j := submit(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "locked", Files: files(fmt.Sprintf(stackWithGate, gate(dir)))})
	waitFile(t, filepath.Join(dir, "started"))

	for _, op := range []tfrun.Op{tfrun.OpApply, tfrun.OpPlan, tfrun.OpDestroy} {
		if _, err := e.Submit(t.Context(), tfrun.Request{Op: op, ContentID: "locked"}); !errors.Is(err, tfrun.ErrLocked) {
			t.Errorf("same engine %s: %v, want ErrLocked", op, err)
		}
		if _, err := other.Submit(t.Context(), tfrun.Request{Op: op, ContentID: "locked"}); !errors.Is(err, tfrun.ErrLocked) {
			t.Errorf("other engine %s: %v, want ErrLocked", op, err)
		}
	}
	// Another content id is not affected.
	run(t, other, tfrun.Request{Op: tfrun.OpApply, ContentID: "free", Files: files(`resource "terraform_data" "x" {}`)}, tfrun.StatusSucceeded)
	// The other engine sees the job through the shared Dir, and cannot cancel it.
	if oj, err := other.Job(j.ID); err != nil || oj.Status != tfrun.StatusRunning {
		t.Errorf("job seen from the other engine: %+v, %v", oj, err)
	}
	if err := other.Cancel(t.Context(), j.ID); !errors.Is(err, tfrun.ErrState) {
		t.Errorf("cancel from the other engine: %v, want ErrState", err)
	}

	release(t, dir)
	run := tfruntest.Wait(t, e, j.ID, jobTimeout)
	if run.Status != tfrun.StatusSucceeded {
		t.Fatalf("gated apply: %s %v", run.Status, run.Err())
	}
	// Free again, from either engine.
	if _, err := other.Submit(t.Context(), tfrun.Request{Op: tfrun.OpPlan, ContentID: "locked"}); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func TestCancelMidApply(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{CancelGrace: 30 * time.Second})
	dir := tfruntest.WorkDir(e, "cancel")
	// Until released, the provisioner sleeps (exec: the pid it recorded is the sleep's).
	cmd := fmt.Sprintf(`echo $$ > %[1]s/pid; touch %[1]s/started; [ -f %[1]s/release ] || exec sleep 300`, dir)
	j := submit(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "cancel", Files: files(fmt.Sprintf(stackWithGate, cmd))})
	waitFile(t, filepath.Join(dir, "started"))

	if err := e.Cancel(t.Context(), j.ID); err != nil {
		t.Fatal(err)
	}
	got, err := e.Job(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != tfrun.StatusCancelled || got.Error == nil || got.Error.Kind != tfrun.KindCancelled {
		t.Fatalf("cancelled job: %s %+v", got.Status, got.Error)
	}
	// Terraform wrote the state on SIGINT: the fast resources are in it.
	addrs := tfruntest.Addresses(got.Result.Resources)
	if !slices.Contains(addrs, "terraform_data.fast[0]") || !slices.Contains(addrs, "terraform_data.fast[1]") {
		t.Fatalf("state after cancel: %v", addrs)
	}
	st, err := e.State(t.Context(), "cancel")
	if err != nil || len(st.Values.RootModule.Resources) != len(addrs) {
		t.Fatalf("State after cancel: %v (%d resources, want %d)", err, len(st.Values.RootModule.Resources), len(addrs))
	}
	if err := e.Cancel(t.Context(), j.ID); !errors.Is(err, tfrun.ErrState) {
		t.Errorf("second cancel: %v, want ErrState", err)
	}
	// The provisioner's sleep did not outlive the run, nor did terraform or its provider.
	tfruntest.AssertNoProcesses(t, 30*time.Second, dir)

	// The next apply converges: nothing tainted, nothing left to do.
	release(t, dir)
	next := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "cancel"}, tfrun.StatusSucceeded)
	for _, r := range next.Result.Resources {
		if r.Tainted {
			t.Errorf("%s still tainted", r.Address)
		}
	}
	if got := tfruntest.Addresses(next.Result.Resources); len(got) != 3 {
		t.Errorf("state after converging apply: %v", got)
	}
	plan := run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: "cancel"}, tfrun.StatusSucceeded)
	if len(plan.Result.Changes) != 0 {
		t.Errorf("plan after converging: %+v", plan.Result.Changes)
	}
}

func TestHang(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{HangTimeout: time.Second, CancelGrace: 30 * time.Second})
	dir := tfruntest.WorkDir(e, "hang")
	// Terraform says "Still creating..." every 10s; before that it is silent while the provisioner
	// sleeps, which is a hang for a 1s HangTimeout.
	cmd := fmt.Sprintf(`echo $$ > %[1]s/pid; exec sleep 300`, dir)
	j := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "hang", Files: files(fmt.Sprintf(`
resource "terraform_data" "stuck" {
  provisioner "local-exec" {
    command = %q
  }
}`, cmd))}, tfrun.StatusHung)
	if j.Error == nil || j.Error.Kind != tfrun.KindHung || !strings.Contains(j.Error.Message, "no output from terraform for 1s") {
		t.Fatalf("hung job error: %+v", j.Error)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, dir)
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	// A good stack next door, applied before and checked after.
	good := files(`resource "terraform_data" "ok" { input = "fine" }`)
	before := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "good", Files: good}, tfrun.StatusSucceeded)

	tests := []struct {
		name     string
		files    map[string][]byte
		vars     map[string]any
		file     string // want a diagnostic in this file ("" = no location)
		line     int
		summary  string
		contains string
	}{
		{
			name:    "invalid-hcl",
			files:   files("resource \"terraform_data\" \"x\" {\n  input = \n}\n"),
			file:    "main.tf",
			line:    2,
			summary: "Invalid expression",
		},
		{
			name:    "invalid-json",
			files:   map[string][]byte{"main.tf.json": []byte(`{"resource": {"terraform_data": {"x": {"input": }}}}`)},
			file:    "main.tf.json",
			line:    1,
			summary: "Missing JSON value",
		},
		{
			name:     "unknown-provider",
			files:    files(`resource "nosuch_thing" "x" {}`),
			summary:  "Failed to query available provider packages",
			contains: "hashicorp/nosuch",
		},
		{
			name:    "unknown-resource-type",
			files:   files("resource \"local_nosuch\" \"x\" {}\n"),
			file:    "main.tf",
			line:    1,
			summary: "Invalid resource type",
		},
		{
			name: "missing-variable",
			files: files(`variable "need" {
  type = string
}
resource "terraform_data" "x" { input = var.need }
`),
			vars:    map[string]any{},
			file:    "main.tf",
			line:    1,
			summary: "No value for required variable",
		},
	}
	t.Run("group", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				j := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: tt.name, Files: tt.files, Variables: tt.vars}, tfrun.StatusFailed)
				if j.Error.Kind != tfrun.KindTerraform {
					t.Fatalf("error kind %q: %v", j.Error.Kind, j.Error)
				}
				var found *tfrun.Diagnostic
				for i, d := range j.Error.Diagnostics {
					if d.Summary == tt.summary {
						found = &j.Error.Diagnostics[i]
					}
				}
				if found == nil {
					t.Fatalf("no %q diagnostic in %+v", tt.summary, j.Error.Diagnostics)
				}
				if found.Filename != tt.file || found.Line != tt.line {
					t.Errorf("diagnostic at %s:%d, want %s:%d", found.Filename, found.Line, tt.file, tt.line)
				}
				if !strings.Contains(j.Error.Message, tt.summary) || !strings.Contains(j.Error.Message, tt.contains) {
					t.Errorf("message %q lacks %q / %q", j.Error.Message, tt.summary, tt.contains)
				}
				if tt.file != "" && !strings.Contains(j.Error.Message, fmt.Sprintf("%s:%d", tt.file, tt.line)) {
					t.Errorf("message %q lacks the location", j.Error.Message)
				}
				t.Logf("error: %s", j.Error.Message)
			})
		}
		t.Run("same-stack", func(t *testing.T) {
			t.Parallel()
			// Broken content on an applied stack fails, and leaves its state alone.
			run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "mixed", Files: good}, tfrun.StatusSucceeded)
			st1, err := e.State(t.Context(), "mixed")
			if err != nil {
				t.Fatal(err)
			}
			run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "mixed", Files: files(`resource "terraform_data" "x" {`)}, tfrun.StatusFailed)
			st2, err := e.State(t.Context(), "mixed")
			if err != nil {
				t.Fatal(err)
			}
			if id1, id2 := st1.Values.RootModule.Resources[0].AttributeValues["id"], st2.Values.RootModule.Resources[0].AttributeValues["id"]; id1 != id2 {
				t.Errorf("state changed by a failed run: %v → %v", id1, id2)
			}
			fixed := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "mixed", Files: good}, tfrun.StatusSucceeded)
			if s := fixed.Result.Summary; s.Add+s.Change+s.Remove != 0 {
				t.Errorf("apply after the fix changed things: %+v", s)
			}
		})
	})
	// Nothing else was harmed: the good stack is as it was.
	after := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "good"}, tfrun.StatusSucceeded)
	if s := after.Result.Summary; s.Add+s.Change+s.Remove != 0 ||
		after.Result.Resources[0].Values["id"] != before.Result.Resources[0].Values["id"] {
		t.Errorf("good stack changed: %+v", after.Result)
	}
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	ctx := t.Context()
	bad := []tfrun.Request{
		{Op: "refresh", ContentID: "x", Files: files("")},
		{Op: tfrun.OpApply, ContentID: "../x", Files: files("")},
		{Op: tfrun.OpApply, ContentID: ".hidden", Files: files("")},
		{Op: tfrun.OpApply, ContentID: "", Files: files("")},
		{Op: tfrun.OpApply, ContentID: "x", Files: map[string][]byte{"../main.tf": nil}},
		{Op: tfrun.OpApply, ContentID: "x", Files: map[string][]byte{"main.sh": nil}},
	}
	for _, req := range bad {
		if _, err := e.Submit(ctx, req); !errors.Is(err, tfrun.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", req, err)
		}
	}
	if _, err := e.Submit(ctx, tfrun.Request{Op: tfrun.OpDestroy, ContentID: "never-applied"}); !errors.Is(err, tfrun.ErrNotFound) {
		t.Errorf("destroy with nothing stored: %v, want ErrNotFound", err)
	}
	// That failed Submit left no lease behind.
	run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "never-applied", Files: files(`resource "terraform_data" "x" {}`)}, tfrun.StatusSucceeded)
	for _, id := range []string{"0123456789abcdef01234567", "../../etc/passwd", ""} {
		if _, err := e.Job(id); !errors.Is(err, tfrun.ErrNotFound) {
			t.Errorf("job %q: %v, want ErrNotFound", id, err)
		}
		if _, err := e.Watch(ctx, id); !errors.Is(err, tfrun.ErrNotFound) {
			t.Errorf("watch %q: %v, want ErrNotFound", id, err)
		}
	}
	if _, err := e.State(ctx, "nothing-here"); !errors.Is(err, tfrun.ErrNotFound) {
		t.Errorf("state: %v, want ErrNotFound", err)
	}
}

// TestLeaseRenewedWhileRunning: a run that lasts longer than LeaseTTL keeps its lease, so another
// terraformer still gets ErrLocked after the first expiry has passed.
func TestLeaseRenewedWhileRunning(t *testing.T) {
	t.Parallel()
	engineDir := t.TempDir()
	const ttl = 600 * time.Millisecond
	e := tfruntest.NewEngine(t, tfrun.Options{Dir: engineDir, LeaseTTL: ttl})
	dir := tfruntest.WorkDir(e, "renewed")
	other := tfruntest.NewEngine(t, tfrun.Options{Dir: engineDir, LeaseTTL: ttl})
	t.Cleanup(func() { os.WriteFile(filepath.Join(dir, "release"), nil, 0o600) })
	j := submit(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "renewed", Files: files(fmt.Sprintf(stackWithGate, gate(dir)))})
	waitFile(t, filepath.Join(dir, "started"))

	type lease struct {
		JobID   string    `json:"jobId"`
		Expires time.Time `json:"expires"`
	}
	read := func() lease {
		var l lease
		b, err := os.ReadFile(filepath.Join(engineDir, "stacks", "renewed", "lease.json"))
		if err == nil {
			err = json.Unmarshal(b, &l)
		}
		if err != nil {
			t.Fatalf("lease: %v", err)
		}
		return l
	}
	first := read()
	if first.JobID != j.ID {
		t.Fatalf("lease held by %q, want job %s", first.JobID, j.ID)
	}
	testutil.Eventually(t, time.Minute, func() bool { return time.Now().After(first.Expires) }, "clock")
	if _, err := other.Submit(t.Context(), tfrun.Request{Op: tfrun.OpApply, ContentID: "renewed"}); !errors.Is(err, tfrun.ErrLocked) {
		t.Fatalf("submit after the first expiry: %v, want ErrLocked", err)
	}
	if l := read(); !l.Expires.After(first.Expires) {
		t.Errorf("lease not renewed: %s", l.Expires)
	}
	release(t, dir)
	if got := tfruntest.Wait(t, e, j.ID, jobTimeout); got.Status != tfrun.StatusSucceeded {
		t.Fatalf("run: %s %v", got.Status, got.Err())
	}
}

// TestRootOwnedWorkDir: a stack that an older terraformer ran (terraform as root: work dir and
// files root's, 0700/0600) is still readable and runnable: the sandbox user gets the work dir.
func TestRootOwnedWorkDir(t *testing.T) {
	t.Parallel()
	e := tfruntest.NewEngine(t, tfrun.Options{})
	main := `
resource "terraform_data" "x" { input = "old" }
output "x" { value = terraform_data.x.output }`
	run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "old", Files: files(main)}, tfrun.StatusSucceeded)
	work := tfruntest.WorkDir(e, "old")
	err := filepath.WalkDir(work, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, 0, 0); err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(p, 0o700)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.Options().Dir, "stacks", "old", "state.json")); err != nil {
		t.Fatal(err)
	}
	if out, err := e.Outputs(t.Context(), "old"); err != nil || out["x"] != "old" {
		t.Fatalf("outputs of a root-owned stack: %v %v", out, err)
	}
	run(t, e, tfrun.Request{Op: tfrun.OpDestroy, ContentID: "old"}, tfrun.StatusSucceeded)
}
