package terraformer_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

func TestPlanApplyDestroy(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	c := env.Client
	// The sandbox lets terraform write only in its work dir (and its private /tmp).
	out := filepath.Join(tfruntest.WorkDir(env.Engine, "round-trip"), "hello.txt")
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
output "greeting" { value = local_file.f.content }
`)

	plan := run(t, c, tfrun.OpPlan, terraformer.Request{ContentID: "round-trip", Files: files(main), TraceID: "trace-1"}, tfrun.StatusSucceeded)
	if plan.Result == nil || plan.Result.Summary.Add != 4 || len(plan.Result.Changes) != 4 || plan.TraceID != "trace-1" {
		t.Fatalf("plan result: %+v", plan.Result)
	}
	for _, ch := range plan.Result.Changes {
		if !slices.Equal(ch.Actions, []string{"create"}) {
			t.Errorf("%s: actions %v", ch.Address, ch.Actions)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("plan created the file")
	}

	// Apply the stored files, watching: progress, log lines and the final job arrive as events.
	id := submit(t, c, tfrun.OpApply, terraformer.Request{ContentID: "round-trip"})
	var mu sync.Mutex
	types := map[tfrun.EventType]int{}
	var percents []int
	j, err := c.Wait(t.Context(), id, func(ev terraformer.Event) {
		mu.Lock()
		defer mu.Unlock()
		types[ev.Type]++
		if ev.JobID != id {
			t.Errorf("event of job %s while watching %s", ev.JobID, id)
		}
		if ev.Type == tfrun.EventProgress {
			percents = append(percents, ev.Percent)
		}
	})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if types[tfrun.EventJob] != 1 || types[tfrun.EventFinal] != 1 || types[tfrun.EventProgress] == 0 || types[tfrun.EventLog] == 0 {
		t.Errorf("events by type: %v", types)
	}
	if !slices.IsSorted(percents) {
		t.Errorf("percent went backwards: %v", percents)
	}
	if j.Percent != 100 || j.Planned != 4 || j.Completed != 4 || len(j.Resources) != 4 {
		t.Errorf("apply progress: %d%%, %d/%d, %d resources", j.Percent, j.Completed, j.Planned, len(j.Resources))
	}
	want := []string{"local_file.f", "terraform_data.a[0]", "terraform_data.a[1]", "terraform_data.a[2]"}
	if got := tfruntest.Addresses(j.Result.Resources); !slices.Equal(got, want) {
		t.Fatalf("applied resources %v, want %v", got, want)
	}
	if j.Result.Outputs["greeting"].Value != "hello 3" {
		t.Errorf("outputs %+v", j.Result.Outputs)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "hello 3" {
		t.Fatalf("local_file: %q %v", b, err)
	}

	// The same job read later, state and outputs.
	again, err := c.Job(t.Context(), id)
	if err != nil || again.Status != tfrun.StatusSucceeded || len(again.Result.Resources) != 4 {
		t.Fatalf("job read later: %+v %v", again, err)
	}
	st, err := c.State(t.Context(), "round-trip")
	if err != nil || len(st.Values.RootModule.Resources) != 4 {
		t.Fatalf("state: %+v %v", st, err)
	}
	outs, err := c.Outputs(t.Context(), "round-trip")
	if err != nil || outs["greeting"] != "hello 3" {
		t.Fatalf("outputs: %v %v", outs, err)
	}
	if ids, _ := outs["ids"].([]any); len(ids) != 3 {
		t.Errorf("ids output %v", outs["ids"])
	}

	// New variables shrink the stack; destroy reuses files and variables.
	shrink := run(t, c, tfrun.OpApply, terraformer.Request{ContentID: "round-trip", Variables: map[string]any{"n": 1}}, tfrun.StatusSucceeded)
	if got := tfruntest.Addresses(shrink.Result.Resources); len(got) != 2 {
		t.Errorf("after shrink: %v", got)
	}
	destroy := run(t, c, tfrun.OpDestroy, terraformer.Request{ContentID: "round-trip"}, tfrun.StatusSucceeded)
	if len(destroy.Result.Resources) != 0 || destroy.Result.Summary.Remove != 2 {
		t.Errorf("destroy result %+v", destroy.Result)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("destroy left the file")
	}
	outs, err = c.Outputs(t.Context(), "round-trip")
	if err != nil || len(outs) != 0 {
		t.Errorf("outputs after destroy: %v %v", outs, err)
	}
}

func TestConcurrentApplies(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	const n = 3
	var gates, ids []string
	for i := range n {
		dir := tfruntest.WorkDir(env.Engine, fmt.Sprintf("parallel-%d", i))
		releaseAtEnd(t, dir)
		gates = append(gates, dir)
		ids = append(ids, submit(t, env.Client, tfrun.OpApply, terraformer.Request{
			ContentID: fmt.Sprintf("parallel-%d", i), Files: files(gated(pollGateCmd(dir)))}))
	}
	// Every run reaches its gate while none is released: they overlap.
	for _, dir := range gates {
		waitFile(t, filepath.Join(dir, "started"))
	}
	for i, id := range ids {
		j, err := env.Client.Job(t.Context(), id)
		if err != nil || j.Status != tfrun.StatusRunning {
			t.Fatalf("job %d while all are gated: %+v %v", i, j, err)
		}
	}
	for _, dir := range gates {
		release(t, dir)
	}
	for _, id := range ids {
		if j := wait(t, env.Client, id, tfrun.StatusSucceeded); len(j.Result.Resources) != 3 {
			t.Errorf("job %s resources %v", id, tfruntest.Addresses(j.Result.Resources))
		}
	}
}

func TestSameContentIDConflicts(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	dir := tfruntest.WorkDir(env.Engine, "locked")
	releaseAtEnd(t, dir)
	id := submit(t, env.Client, tfrun.OpApply, terraformer.Request{ContentID: "locked", Files: files(gated(pollGateCmd(dir)))})
	waitFile(t, filepath.Join(dir, "started"))

	for _, op := range []tfrun.Op{tfrun.OpApply, tfrun.OpPlan, tfrun.OpDestroy} {
		var err error
		switch op {
		case tfrun.OpApply:
			_, err = env.Client.Apply(t.Context(), terraformer.Request{ContentID: "locked"})
		case tfrun.OpPlan:
			_, err = env.Client.Plan(t.Context(), terraformer.Request{ContentID: "locked"})
		case tfrun.OpDestroy:
			_, err = env.Client.Destroy(t.Context(), terraformer.Request{ContentID: "locked"})
		}
		var ke *kite.Error
		if !errors.Is(err, kite.ErrConflict) || !errors.As(err, &ke) || ke.Code != -32004 {
			t.Fatalf("%s while locked: %v, want -32004", op, err)
		}
		if !strings.Contains(err.Error(), id) {
			t.Errorf("%s while locked: %q does not name the job holding the lease (%s)", op, err, id)
		}
	}
	// Another content id is not affected.
	run(t, env.Client, tfrun.OpApply, terraformer.Request{ContentID: "neighbour", Files: files(`resource "terraform_data" "x" {}`)}, tfrun.StatusSucceeded)
	release(t, dir)
	wait(t, env.Client, id, tfrun.StatusSucceeded)
	run(t, env.Client, tfrun.OpPlan, terraformer.Request{ContentID: "locked"}, tfrun.StatusSucceeded)
}

func TestCancelThenConverge(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{Engine: tfrun.Options{CancelGrace: 30 * time.Second}})
	c := env.Client
	dir := tfruntest.WorkDir(env.Engine, "cancel")
	releaseAtEnd(t, dir)
	id := submit(t, c, tfrun.OpApply, terraformer.Request{ContentID: "cancel", Files: files(gated(gateCmd(dir)))})
	waitFile(t, filepath.Join(dir, "started"))

	// A watcher sees the job end cancelled.
	watched := make(chan error, 1)
	go func() {
		_, err := c.Wait(t.Context(), id, nil)
		watched <- err
	}()
	j, err := c.Cancel(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != tfrun.StatusCancelled || j.Error == nil || j.Error.Kind != tfrun.KindCancelled {
		t.Fatalf("cancelled job: %s %+v", j.Status, j.Error)
	}
	// Terraform saved the state on SIGINT: the fast resources are in it.
	if got := tfruntest.Addresses(j.Result.Resources); !slices.Contains(got, "terraform_data.fast[0]") || !slices.Contains(got, "terraform_data.fast[1]") {
		t.Fatalf("state after cancel: %v", got)
	}
	var je *tfrun.JobError
	if err := <-watched; !errors.As(err, &je) || je.Kind != tfrun.KindCancelled {
		t.Errorf("Wait on the cancelled job: %v", err)
	}
	if _, err := c.Cancel(t.Context(), id); !errors.Is(err, kite.ErrState) {
		t.Errorf("second cancel: %v, want -32005", err)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, dir)

	release(t, dir)
	next := run(t, c, tfrun.OpApply, terraformer.Request{ContentID: "cancel"}, tfrun.StatusSucceeded)
	for _, r := range next.Result.Resources {
		if r.Tainted {
			t.Errorf("%s still tainted", r.Address)
		}
	}
	if got := tfruntest.Addresses(next.Result.Resources); len(got) != 3 {
		t.Errorf("state after the converging apply: %v", got)
	}
	if plan := run(t, c, tfrun.OpPlan, terraformer.Request{ContentID: "cancel"}, tfrun.StatusSucceeded); len(plan.Result.Changes) != 0 {
		t.Errorf("plan after converging: %+v", plan.Result.Changes)
	}
}

// TestCallerDisconnects: the caller goes away mid-apply, the job finishes without it, and a new
// connection reads the result.
func TestCallerDisconnects(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	dir := tfruntest.WorkDir(env.Engine, "orphan")
	releaseAtEnd(t, dir)
	caller := env.NewClient(env.KiteKeyAuth("kloud"))
	id := submit(t, caller, tfrun.OpApply, terraformer.Request{ContentID: "orphan", Files: files(gated(pollGateCmd(dir)))})
	waitFile(t, filepath.Join(dir, "started"))
	if err := caller.Close(); err != nil {
		t.Fatal(err)
	}
	release(t, dir)

	later := env.NewClient(env.KiteKeyAuth("kloud"))
	testutil.Eventually(t, jobTimeout, func() bool {
		j, err := later.Job(t.Context(), id)
		return err == nil && j.Status.Final()
	}, "job %s never finished", id)
	j, err := later.Job(t.Context(), id)
	if err != nil || j.Status != tfrun.StatusSucceeded || j.Result.Outputs["slow"].Value != "slow" || len(j.Result.Resources) != 3 {
		t.Fatalf("job read after reconnect: %+v %v", j, err)
	}
}

// TestWaitSurvivesDisconnect drops every connection while a client waits: Wait reconnects, and
// the result is not lost, whether the job finished while the client was away or after.
func TestWaitSurvivesDisconnect(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	dir := tfruntest.WorkDir(env.Engine, "reconnect")
	releaseAtEnd(t, dir)
	c := env.Client
	id := submit(t, c, tfrun.OpApply, terraformer.Request{ContentID: "reconnect", Files: files(gated(pollGateCmd(dir)))})
	waitFile(t, filepath.Join(dir, "started"))

	snapshots := make(chan struct{}, 16)
	type result struct {
		j   *tfrun.Job
		err error
	}
	done := make(chan result, 1)
	go func() {
		j, err := c.Wait(t.Context(), id, func(ev terraformer.Event) {
			if ev.Type == tfrun.EventJob {
				snapshots <- struct{}{}
			}
		})
		done <- result{j, err}
	}()
	<-snapshots // watching
	before := c.Connects()
	env.DropConnections()
	// A second watch (after the reconnect) starts with a new snapshot.
	select {
	case <-snapshots:
	case <-time.After(time.Minute):
		t.Fatal("Wait did not watch again after the connection dropped")
	}
	if c.Connects() <= before {
		t.Errorf("connects %d, was %d: no reconnect", c.Connects(), before)
	}
	release(t, dir)
	r := <-done
	if r.err != nil || r.j.Status != tfrun.StatusSucceeded || len(r.j.Result.Resources) != 3 {
		t.Fatalf("Wait after a reconnect: %+v %v", r.j, r.err)
	}

	// Now the job ends while nobody is connected: a Wait that starts afterwards gets the result.
	dir2 := tfruntest.WorkDir(env.Engine, "reconnect-later")
	releaseAtEnd(t, dir2)
	id2 := submit(t, c, tfrun.OpApply, terraformer.Request{ContentID: "reconnect-later", Files: files(gated(pollGateCmd(dir2)))})
	waitFile(t, filepath.Join(dir2, "started"))
	c.Close()
	release(t, dir2)
	testutil.Eventually(t, jobTimeout, func() bool {
		j, err := env.Engine.Job(id2)
		return err == nil && j.Status.Final()
	}, "job %s never finished", id2)
	if j := wait(t, env.NewClient(env.KiteKeyAuth("kloud")), id2, tfrun.StatusSucceeded); len(j.Result.Resources) != 3 {
		t.Errorf("job %s: %v", id2, tfruntest.Addresses(j.Result.Resources))
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	tests := []struct {
		name     string
		files    map[string]string
		vars     map[string]any
		file     string
		line     int
		summary  string
		contains string
	}{
		{name: "invalid-hcl", files: files("resource \"terraform_data\" \"x\" {\n  input = \n}\n"), file: "main.tf", line: 2, summary: "Invalid expression"},
		{name: "invalid-json", files: map[string]string{"main.tf.json": `{"resource": {"terraform_data": {"x": {"input": }}}}`}, file: "main.tf.json", line: 1, summary: "Missing JSON value"},
		{name: "unknown-provider", files: files(`resource "nosuch_thing" "x" {}`), summary: "Failed to query available provider packages", contains: "hashicorp/nosuch"},
		{name: "missing-variable", files: files("variable \"need\" {\n  type = string\n}\nresource \"terraform_data\" \"x\" { input = var.need }\n"),
			vars: map[string]any{}, file: "main.tf", line: 1, summary: "No value for required variable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := run(t, env.Client, tfrun.OpApply, terraformer.Request{ContentID: tt.name, Files: tt.files, Variables: tt.vars}, tfrun.StatusFailed)
			if j.Error.Kind != tfrun.KindTerraform {
				t.Fatalf("error kind %q: %v", j.Error.Kind, j.Error)
			}
			i := slices.IndexFunc(j.Error.Diagnostics, func(d tfrun.Diagnostic) bool { return d.Summary == tt.summary })
			if i < 0 {
				t.Fatalf("no diagnostic %q in %+v", tt.summary, j.Error.Diagnostics)
			}
			d := j.Error.Diagnostics[i]
			if d.Filename != tt.file || d.Line != tt.line {
				t.Errorf("diagnostic at %s:%d, want %s:%d", d.Filename, d.Line, tt.file, tt.line)
			}
			if !strings.Contains(j.Error.Message, tt.summary) || !strings.Contains(j.Error.Message, tt.contains) {
				t.Errorf("error message %q lacks %q / %q", j.Error.Message, tt.summary, tt.contains)
			}
			if tt.file != "" && !strings.Contains(j.Error.Message, fmt.Sprintf("%s:%d", tt.file, tt.line)) {
				t.Errorf("error message %q lacks the location", j.Error.Message)
			}
		})
	}
}

func TestInvalidParams(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	ctx := t.Context()
	conn, err := env.Dial(ctx, kite.Auth{Type: kite.AuthKiteKey, Key: env.KiteKey("kloud")})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		method  string
		params  any
		want    *kite.Error
		message string
	}{
		{terraformer.MethodApply, map[string]any{}, kite.ErrInvalidParams, "contentId is required"},
		{terraformer.MethodApply, map[string]any{"contentId": "../etc"}, kite.ErrInvalidParams, "contentId"},
		{terraformer.MethodApply, map[string]any{"contentId": "ok", "files": map[string]string{"../main.tf": ""}}, kite.ErrInvalidParams, "../main.tf"},
		{terraformer.MethodApply, map[string]any{"contentId": "ok", "files": map[string]string{"main.sh": ""}}, kite.ErrInvalidParams, "main.sh"},
		{terraformer.MethodPlan, map[string]any{"contentId": "ok", "variables": map[string]any{"not a name": 1}}, kite.ErrInvalidParams, "not a name"},
		{terraformer.MethodPlan, map[string]any{"contentId": "ok", "content": "x"}, kite.ErrInvalidParams, "unknown field"},
		{terraformer.MethodPlan, map[string]any{"contentId": "ok", "traceId": strings.Repeat("t", 200)}, kite.ErrInvalidParams, "traceId"},
		{terraformer.MethodPlan, map[string]any{"contentId": "nothing-stored"}, kite.ErrNotFound, "no files"},
		{terraformer.MethodJob, map[string]any{"jobId": "x"}, kite.ErrInvalidParams, "jobId"},
		{terraformer.MethodJob, map[string]any{"jobId": "0123456789abcdef01234567"}, kite.ErrNotFound, "0123456789abcdef01234567"},
		{terraformer.MethodWatch, map[string]any{"jobId": "0123456789abcdef01234567"}, kite.ErrNotFound, "not found"},
		{terraformer.MethodCancel, map[string]any{}, kite.ErrInvalidParams, "jobId is required"},
		{terraformer.MethodState, map[string]any{"contentId": "never-ran"}, kite.ErrNotFound, "never-ran"},
		{terraformer.MethodOutputs, map[string]any{"contentId": ""}, kite.ErrInvalidParams, "contentId is required"},
	}
	for _, tt := range tests {
		err := conn.Call(ctx, tt.method, tt.params, nil)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.message) {
			t.Errorf("%s %v: %v, want %s containing %q", tt.method, tt.params, err, tt.want.Message, tt.message)
		}
	}
	// The client checks requests before sending them, with the same errors.
	if _, err := env.Client.Apply(ctx, terraformer.Request{ContentID: "-x"}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Errorf("client apply with a bad content id: %v", err)
	}
}

// TestWatchWire reads terraformer.event notifications off a raw connection: a snapshot first, a
// final event last, and the stream's end carries the job's error (-32005 with the JobError as
// details) for a failed job, nothing for a good one.
func TestWatchWire(t *testing.T) {
	t.Parallel()
	env := terraformertest.Start(t, terraformertest.Options{})
	ctx := t.Context()
	conn, err := env.Dial(ctx, kite.Auth{Type: kite.AuthKiteKey, Key: env.KiteKey("kloud")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, main string
		status     tfrun.Status
		code       int64
	}{
		{"good", `resource "terraform_data" "x" {}`, tfrun.StatusSucceeded, 0},
		{"bad", "resource \"terraform_data\" \"x\" {\n  input = \n}\n", tfrun.StatusFailed, kite.CodeState},
	} {
		var sub terraformer.SubmitResult
		if err := conn.Call(ctx, terraformer.MethodApply, terraformer.Request{ContentID: "wire-" + tt.name, Files: files(tt.main)}, &sub); err != nil {
			t.Fatal(err)
		}
		var w terraformer.WatchResult
		if err := conn.Call(ctx, terraformer.MethodWatch, terraformer.JobParams{JobID: sub.JobID}, &w); err != nil {
			t.Fatal(err)
		}
		s := conn.Subscribe(w.Subscription)
		var evs []terraformer.Event
		for {
			n, err := s.Next(ctx)
			if err != nil {
				var ke *kite.Error
				switch {
				case tt.code == 0 && !errors.Is(err, kite.ErrStreamEnded):
					t.Errorf("%s: stream ended with %v, want a plain end", tt.name, err)
				case tt.code != 0 && (!errors.As(err, &ke) || ke.Code != tt.code || ke.Data == nil || ke.Data.Details == nil):
					t.Errorf("%s: stream ended with %#v, want code %d with details", tt.name, err, tt.code)
				case tt.code != 0:
					d, _ := ke.Data.Details.(map[string]any)
					if d["kind"] != tfrun.KindTerraform || !strings.Contains(fmt.Sprint(d["diagnostics"]), "Invalid expression") {
						t.Errorf("%s: end details %v", tt.name, ke.Data.Details)
					}
				}
				break
			}
			if n.Method != terraformer.EventMethod {
				t.Errorf("notification %s", n.Method)
			}
			var ev terraformer.Event
			if err := json.Unmarshal(n.Data, &ev); err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		// (A job that finished before the watch gets just the final event.)
		if len(evs) == 0 || (len(evs) > 1 && evs[0].Type != tfrun.EventJob) || evs[len(evs)-1].Type != tfrun.EventFinal || evs[len(evs)-1].Job.Status != tt.status {
			t.Errorf("%s: events %+v", tt.name, evs)
		}
	}
}
