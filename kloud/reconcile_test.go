package kloud_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// "No state without an exit": cancelling a build or destroy at any stage ends with a stack that
// can be built again or destroyed; stuck records are reconciled; administrators can reset.

// gatedTF is the real terraformer client with gates a test can close: while a gate is closed,
// kloud's call blocks until its context ends (as if terraformer were busy or slow), so a test
// can cancel a job exactly at that stage.
type gatedTF struct {
	kloud.Terraformer
	mu      sync.Mutex
	closed  map[string]bool
	entered chan string
}

func (g *gatedTF) close(gate string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed[gate] = true
}

func (g *gatedTF) open(gate string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.closed, gate)
}

func (g *gatedTF) block(ctx context.Context, gate string) error {
	g.mu.Lock()
	closed := g.closed[gate]
	g.mu.Unlock()
	if !closed {
		return nil
	}
	select {
	case g.entered <- gate:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func (g *gatedTF) Apply(ctx context.Context, req terraformer.Request) (string, error) {
	if err := g.block(ctx, "apply"); err != nil {
		return "", err
	}
	return g.Terraformer.Apply(ctx, req)
}

func (g *gatedTF) Destroy(ctx context.Context, req terraformer.Request) (string, error) {
	if err := g.block(ctx, "destroy"); err != nil {
		return "", err
	}
	return g.Terraformer.Destroy(ctx, req)
}

func (g *gatedTF) Wait(ctx context.Context, id string, fn func(tfrun.Event)) (*tfrun.Job, error) {
	if err := g.block(ctx, "wait"); err != nil {
		return nil, err
	}
	return g.Terraformer.Wait(ctx, id, fn)
}

// newGatedFlow is newFlow with kloud's terraformer behind a gatedTF.
func newGatedFlow(t *testing.T, o dummy.Options) (*flowEnv, *gatedTF) {
	f := newFlow(t, o)
	tf, err := f.Server.TerraformerForTest()
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedTF{Terraformer: tf, closed: map[string]bool{}, entered: make(chan string, 8)}
	f.Server.SetTerraformer(g)
	return f, g
}

func (g *gatedTF) waitEntered(t *testing.T, gate string) {
	t.Helper()
	select {
	case got := <-g.entered:
		if got != gate {
			t.Fatalf("entered gate %q, want %q", got, gate)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("kloud never reached gate %q", gate)
	}
}

func (f *flowEnv) apply(sid string, destroy bool) string {
	f.t.Helper()
	ref, err := f.client().StackApply(f.t.Context(), api.StackApplyParams{StackID: sid, Destroy: destroy})
	if err != nil {
		f.t.Fatalf("stack.apply: %v", err)
	}
	return ref.JobID
}

func (f *flowEnv) cancel(jobID string) {
	f.t.Helper()
	if _, err := f.client().JobCancel(f.t.Context(), api.JobRef{JobID: jobID}); err != nil {
		f.t.Fatalf("job.cancel: %v", err)
	}
}

func (f *flowEnv) describe(sid string) api.StackView {
	f.t.Helper()
	st, err := f.client().StackDescribe(f.t.Context(), api.StackRef{StackID: sid})
	if err != nil {
		f.t.Fatalf("stack.describe: %v", err)
	}
	return st
}

func (f *flowEnv) job(id string) api.Job {
	f.t.Helper()
	j, err := f.client().JobGet(f.t.Context(), api.JobRef{JobID: id})
	if err != nil {
		f.t.Fatalf("job.get: %v", err)
	}
	return j
}

// settled checks that the stack and its machines are in no transitional state, the stack in
// want, and returns it.
func (f *flowEnv) settled(sid, want string) api.StackView {
	f.t.Helper()
	st := f.describe(sid)
	if st.State != want {
		f.t.Fatalf("stack is %s (%s), want %s", st.State, st.Reason, want)
	}
	for _, m := range st.MachineDocs {
		if m.State.InProgress() {
			f.t.Fatalf("machine %s left %s (%s)", m.Label, m.State, m.Reason)
		}
	}
	return st
}

func (f *flowEnv) mustSucceed(jobID, what string) {
	f.t.Helper()
	if last := f.follow(jobID); last.Status != "succeeded" {
		f.t.Fatalf("%s: %+v", what, last)
	}
}

// destroyed checks that the stack is gone with its machines and their directories.
func (f *flowEnv) destroyed(sid string) {
	f.t.Helper()
	if n := len(f.machines(sid)); n != 0 {
		f.t.Fatalf("%d machines left after destroy", n)
	}
	// stack.describe's old spelling of stackId (id): kept working on the wire.
	if err := f.alice.Call(f.t.Context(), "stack.describe", map[string]string{"id": sid}, nil); !errors.Is(err, kite.ErrNotFound) {
		f.t.Fatalf("stack after destroy: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(f.dir, sid)); len(entries) != 0 {
		f.t.Fatalf("machine directories left after destroy: %v", entries)
	}
}

const oneVM = `
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho hi"
}
`

func TestCancelBuildBeforeTerraformStarts(t *testing.T) {
	t.Parallel()
	f, g := newGatedFlow(t, dummy.Options{})
	f.credential()
	sid, _ := f.stack(f.template(oneVM))
	g.close("apply")
	job := f.apply(sid, false)
	g.waitEntered(t, "apply")
	f.cancel(job)
	if last := f.follow(job); last.Status != "cancelled" {
		t.Fatalf("cancelled build: %+v", last)
	}
	st := f.settled(sid, model.StackFailed)
	if !strings.Contains(st.Reason, "cancelled") {
		t.Fatalf("reason %q does not say the build was cancelled", st.Reason)
	}
	for _, m := range st.MachineDocs {
		if m.State != provider.NotInitialized { // terraform never ran: nothing was made
			t.Fatalf("machine %s is %s, want NotInitialized", m.Label, m.State)
		}
	}
	g.open("apply")
	f.mustSucceed(f.apply(sid, false), "build again")
	f.settled(sid, model.StackInitialized)
	f.mustSucceed(f.apply(sid, true), "destroy")
	f.destroyed(sid)
}

func TestCancelBuildDuringTerraformApply(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	// bcrypt is evaluated at apply, not at plan: terraform itself is busy for many seconds
	// (no provisioner, nothing the template policy refuses).
	sid, _ := f.stack(f.template(oneVM + `
output "slow" {
  value = bcrypt("kloud", 18)
}
`))
	job := f.apply(sid, false)
	testutil.Eventually(t, 2*time.Minute, func() bool {
		j := f.job(job)
		return j.Status.Done() || j.Percent > 40 // terraform reported progress on a resource
	}, "terraform never started")
	if j := f.job(job); j.Status.Done() {
		t.Fatalf("terraform apply was done before the test could cancel it: %+v", j)
	}
	start := time.Now()
	f.cancel(job)
	if last := f.follow(job); last.Status != "cancelled" {
		t.Fatalf("cancelled build: %+v", last)
	}
	t.Logf("cancel took %s (terraform stopped)", time.Since(start))
	st := f.settled(sid, model.StackFailed)
	for _, m := range st.MachineDocs {
		if m.State != provider.Unknown { // terraform ran: the machine may exist
			t.Fatalf("machine %s is %s, want Unknown", m.Label, m.State)
		}
	}
	// Destroy right away: terraform's run was stopped, so it does not wait for the stack.
	f.mustSucceed(f.apply(sid, true), "destroy after a cancelled apply")
	f.destroyed(sid)
}

func TestCancelBuildWhileWaitingForAgents(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	gate := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(gate) })
	// The user script waits while the gate exists: the planner waits for it.
	sid, _ := f.stack(f.template(fmt.Sprintf(`
resource "terraform_data" "vm" {
  input = "#!/bin/bash\nwhile [ -e %s ]; do sleep 0.2; done"
}
`, gate)))
	job := f.apply(sid, false)
	testutil.Eventually(t, 3*time.Minute, func() bool {
		// Registered, and the job has reached its agent wait (under load the agent can register
		// before the job's progress says so).
		m, j := f.machines(sid)["vm"], f.job(job)
		return m.KiteID != "" && len(f.Server.Kontrol.Lookup(kite.Identity{ID: m.KiteID})) == 1 && j.Percent >= 70 || j.Status.Done()
	}, "the machine's agent never registered")
	if j := f.job(job); j.Status.Done() || j.Percent < 70 {
		t.Fatalf("not waiting for agents: %+v", j)
	}
	f.cancel(job)
	if last := f.follow(job); last.Status != "cancelled" {
		t.Fatalf("cancelled build: %+v", last)
	}
	st := f.settled(sid, model.StackFailed)
	if !strings.Contains(st.Reason, "agents") {
		t.Fatalf("reason %q does not say where the build was", st.Reason)
	}
	// The job's log has the lines written after the cancel (they used to be lost with
	// "log job …: context canceled").
	if j := f.job(job); !strings.Contains(strings.Join(j.Log, "\n"), "vm:") {
		t.Fatalf("the agent wait's outcome is not in the job log: %q", j.Log)
	}
	os.Remove(gate)
	f.mustSucceed(f.apply(sid, false), "build again")
	st = f.settled(sid, model.StackInitialized)
	if m := st.MachineDocs[0]; m.State != provider.Running || m.Agent.Status != model.AgentConnected {
		t.Fatalf("after building again: %+v", m)
	}
	f.mustSucceed(f.apply(sid, true), "destroy")
	f.destroyed(sid)
}

func TestCancelDestroy(t *testing.T) {
	t.Parallel()
	f, g := newGatedFlow(t, dummy.Options{})
	f.credential()
	sid, _ := f.stack(f.template(oneVM))
	f.mustSucceed(f.apply(sid, false), "build")

	// Before terraform starts.
	g.close("destroy")
	job := f.apply(sid, true)
	g.waitEntered(t, "destroy")
	f.cancel(job)
	if last := f.follow(job); last.Status != "cancelled" {
		t.Fatalf("cancelled destroy: %+v", last)
	}
	st := f.settled(sid, model.StackFailed)
	if m := st.MachineDocs[0]; m.State != provider.Unknown {
		t.Fatalf("machine after a cancelled destroy: %+v", m)
	}
	g.open("destroy")

	// While kloud waits for terraform's destroy.
	g.close("wait")
	job = f.apply(sid, true)
	g.waitEntered(t, "wait")
	f.cancel(job)
	if last := f.follow(job); last.Status != "cancelled" {
		t.Fatalf("cancelled destroy: %+v", last)
	}
	f.settled(sid, model.StackFailed)
	g.open("wait")

	f.mustSucceed(f.apply(sid, true), "destroy again")
	f.destroyed(sid)
}

// logBuffer collects a kloud's log (and passes it to the test's).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	t   testing.TB
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// seed writes records the way an older kloud (or one killed at the wrong moment) left them.
type seed struct {
	t  *testing.T
	st *store.Store
}

func (s seed) stack(id, state, jobID string, machines map[string]provider.State) {
	s.t.Helper()
	ctx := s.t.Context()
	now := s.st.Now()
	st := model.Stack{ID: id, Title: id, Team: model.DefaultTeam, Owner: "alice", TemplateID: "t-" + id, State: state, JobID: jobID,
		Files: []model.File{{Name: "main.tf", Content: oneVM}}, CreatedAt: now, UpdatedAt: now}
	for label, ms := range machines {
		m := model.Machine{ID: id + "-" + label, StackID: id, Label: label, Resource: label, Provider: "dummy", Owner: "alice",
			Team: model.DefaultTeam, State: ms, Agent: model.Agent{Status: model.AgentNever}, CreatedAt: now, UpdatedAt: now}
		if err := s.st.Machines().InsertMany(ctx, []model.Machine{m}); err != nil {
			s.t.Fatal(err)
		}
		st.Machines = append(st.Machines, m.ID)
	}
	if err := s.st.Stacks().Insert(ctx, st); err != nil {
		s.t.Fatal(err)
	}
}

// job makes a stack.apply job of stack id, started by runner; finished with end unless nil.
func (s seed) job(stackID, runner string, end error) string {
	s.t.Helper()
	ctx := s.t.Context()
	id, err := s.st.Jobs().Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/" + stackID, Owner: "alice"})
	if err != nil {
		s.t.Fatal(err)
	}
	// Its params as a kloud before typed job params wrote them (a map, no destroy).
	storetest.SetFields(s.t, s.st, store.CollJobs, id, map[string]any{"params": map[string]any{"stackId": stackID, "lease": "old-apply"}})
	if _, err := s.st.Jobs().Start(ctx, id, runner); err != nil {
		s.t.Fatal(err)
	}
	if end != nil {
		if err := s.st.Jobs().Finish(ctx, id, end, store.Doc{}); err != nil {
			s.t.Fatal(err)
		}
	} else {
		// Live: its runner keeps it (a lease an hour long, as if renewed).
		storetest.SetFields(s.t, s.st, store.CollJobs, id, map[string]any{"leaseUntil": s.st.Now().Add(time.Hour)})
	}
	return id
}

func TestRestartReconcilesStuckRecords(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: dummyDir(t)}))
	old := kloudtest.Start(t, kloudtest.Options{DataDir: dir, Providers: reg})
	if _, err := old.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	sd := seed{t, old.Server.Store()}
	// A build cancelled by an older kloud whose failure bookkeeping was lost.
	jobA := sd.job("stack-a", "old-kloud", store.ErrJobCancelled)
	sd.stack("stack-a", model.StackBuilding, jobA, map[string]provider.State{"vm0": provider.Building, "vm1": provider.Building})
	// A destroy without a job (written before jobs recorded themselves on the stack).
	sd.stack("stack-b", model.StackDestroying, "", map[string]provider.State{"vm": provider.Terminating})
	// A build whose job is alive in another kloud: never touched.
	jobC := sd.job("stack-c", "other-kloud", nil)
	sd.stack("stack-c", model.StackBuilding, jobC, map[string]provider.State{"vm": provider.Building})
	if _, err := sd.st.AcquireLease(t.Context(), "stack/stack-c", "old-apply", time.Hour); err != nil {
		t.Fatal(err)
	}
	// Held by that other kloud's process (written here through this one's store, which would
	// name this kloud's own process: a restart would know it dead).
	storetest.SetFields(t, sd.st, store.CollLocks, "stack/stack-c", map[string]any{"holder": "0123456789abcdef01234567.0123456789abcdef01234567"})
	// A build cancelled (job.cancel) while its kloud was down: recovery must not resume it.
	jobE := sd.job("stack-e", "old-kloud", nil)
	if _, err := sd.st.Jobs().RequestCancel(t.Context(), jobE); err != nil {
		t.Fatal(err)
	}
	storetest.SetFields(t, sd.st, store.CollJobs, jobE, map[string]any{"leaseUntil": sd.st.Now().Add(-time.Minute)})
	sd.stack("stack-e", model.StackBuilding, jobE, map[string]provider.State{"vm": provider.Building})
	// A machine left Starting by a start job that never got recorded, in a built stack.
	sd.stack("stack-d", model.StackInitialized, "", map[string]provider.State{"vm": provider.Starting, "other": provider.Running})
	// A destroy whose kloud stopped after its last step (the stack's record deleted) and before
	// its end was written: the resumed job finds no stack, which is the destroy done.
	jobF := sd.job("stack-f", "old-kloud", nil)
	storetest.SetFields(t, sd.st, store.CollJobs, jobF, map[string]any{"leaseUntil": sd.st.Now().Add(-time.Minute),
		"params": map[string]any{"stackId": "stack-f", "lease": "old-apply", "destroy": true}})
	old.Stop()

	logs := &logBuffer{t: t}
	e := kloudtest.Start(t, kloudtest.Options{DataDir: dir, Providers: reg, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	e.StartTerraformer()
	f := &flowEnv{Env: e, t: t, alice: e.Dial("alice")}
	testutil.Eventually(t, 30*time.Second, func() bool {
		return f.describe("stack-a").State != model.StackBuilding && f.describe("stack-b").State != model.StackDestroying &&
			f.machines("stack-d")["vm"].State != provider.Starting && f.describe("stack-e").State != model.StackBuilding
	}, "not reconciled")

	testutil.Eventually(t, 30*time.Second, func() bool {
		j, err := e.Server.Store().Jobs().Get(t.Context(), jobF)
		return err == nil && j.Status == store.JobSucceeded
	}, "the resumed destroy of a stack already deleted did not succeed")
	a := f.settled("stack-a", model.StackFailed)
	for _, want := range []string{jobA, "cancelled", "reconciled at"} {
		if !strings.Contains(a.Reason, want) {
			t.Errorf("stack-a's reason %q lacks %q", a.Reason, want)
		}
	}
	for _, m := range a.MachineDocs {
		if m.State != provider.Unknown || !strings.Contains(m.Reason, "reconciled") {
			t.Errorf("stack-a's machine %+v", m)
		}
	}
	b := f.settled("stack-b", model.StackFailed)
	if !strings.Contains(b.Reason, "no job recorded") || b.MachineDocs[0].State != provider.Unknown {
		t.Errorf("stack-b: %+v", b)
	}
	d := f.machines("stack-d")
	if d["vm"].State != provider.Unknown || d["other"].State != provider.Running {
		t.Errorf("stack-d's machines: %+v", d)
	}
	if ej := f.job(jobE); ej.Status != api.JobCancelled {
		t.Errorf("the job cancelled while kloud was down was %s after recovery: %+v", ej.Status, ej)
	}
	if es := f.settled("stack-e", model.StackFailed); !strings.Contains(es.Reason, "cancelled") || es.MachineDocs[0].State != provider.Unknown {
		t.Errorf("stack-e: %+v", es)
	}
	if c := f.describe("stack-c"); c.State != model.StackBuilding || c.MachineDocs[0].State != provider.Building {
		t.Errorf("stack-c, whose job is alive, was changed: %+v", c)
	}
	if !strings.Contains(logs.String(), "reconciled a stuck stack") {
		t.Error("the reconciler did not log what it did")
	}

	// Both reconciled stacks can be destroyed; the live one cannot be touched.
	f.mustSucceed(f.apply("stack-a", true), "destroy stack-a")
	f.mustSucceed(f.apply("stack-b", true), "destroy stack-b")
	if _, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: "stack-c", Destroy: true}); !errors.Is(err, kite.ErrConflict) {
		t.Fatalf("destroy of a stack whose build is alive: %v", err)
	}
	// stack.apply reconciles by itself a stack whose job is over (here: before the next
	// reconciler pass): the job of stack-c ends, its lease is released, destroy works.
	es := e.Server.Store()
	if err := es.ReleaseLease(t.Context(), "stack/stack-c", "old-apply"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client().StackApply(t.Context(), api.StackApplyParams{StackID: "stack-c", Destroy: true}); !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), jobC) {
		t.Fatalf("destroy of a stack whose build job runs: %v", err)
	}
	if err := es.Jobs().Finish(t.Context(), jobC, errors.New("the other kloud gave up"), store.Doc{}); err != nil {
		t.Fatal(err)
	}
	f.mustSucceed(f.apply("stack-c", true), "destroy stack-c")
}

func TestStackResetIsForAdminsAndAudited(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{t: t}
	e := kloudtest.Start(t, kloudtest.Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	admin := e.Client(kloud.Admin)
	if _, err := admin.UserAdd(t.Context(), api.UserAddParams{Username: "alice", Team: model.DefaultTeam}); err != nil {
		t.Fatal(err)
	}
	alice := e.Client("alice")
	sd := seed{t, e.Server.Store()}
	live := sd.job("stack-r", "other-kloud", nil)
	sd.stack("stack-r", model.StackBuilding, live, map[string]provider.State{"vm": provider.Building, "db": provider.NotInitialized})

	reset := api.StackResetParams{StackID: "stack-r", Reason: "INC-42: build hung on a dead host"}
	if _, err := alice.StackReset(t.Context(), reset); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("reset by a non-admin (the stack's owner): %v", err)
	}
	if _, err := admin.StackReset(t.Context(), api.StackResetParams{StackID: "stack-r"}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("reset without a reason: %v", err)
	}
	if _, err := admin.StackReset(t.Context(), reset); !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), live) {
		t.Fatalf("reset while the stack's job runs: %v", err)
	}
	if err := e.Server.Store().Jobs().Finish(t.Context(), live, errors.New("runner gone"), store.Doc{}); err != nil {
		t.Fatal(err)
	}
	st, err := admin.StackReset(t.Context(), reset)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != model.StackFailed || !strings.Contains(st.Reason, "INC-42") || !strings.Contains(st.Reason, kloud.Admin) {
		t.Fatalf("after reset: %+v", st.Stack)
	}
	for _, m := range st.MachineDocs {
		want := map[string]provider.State{"vm": provider.Unknown, "db": provider.NotInitialized}[m.Label]
		if m.State != want {
			t.Errorf("machine %s is %s, want %s", m.Label, m.State, want)
		}
	}
	// The audit record is on the stack, for its owner to see too, and in the log at WARN.
	seen, err := alice.StackDescribe(t.Context(), api.StackRef{StackID: "stack-r"})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen.Resets) != 1 || seen.Resets[0].By != kloud.Admin || seen.Resets[0].Reason != reset.Reason ||
		seen.Resets[0].To != model.StackFailed || seen.Resets[0].Job != live || seen.Resets[0].At.IsZero() {
		t.Fatalf("audit: %+v", seen.Resets)
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN msg=\"stack reset by an administrator\"") || !strings.Contains(l, "INC-42") {
		t.Fatal("the reset is not in the log at WARN")
	}

	// NotInitialized only if nothing was ever built.
	if _, err := admin.StackReset(t.Context(), api.StackResetParams{StackID: "stack-r", State: "NotInitialized", Reason: "never built"}); err != nil {
		t.Fatalf("reset to NotInitialized of a stack never built: %v", err)
	}
	if seen, err = alice.StackDescribe(t.Context(), api.StackRef{StackID: "stack-r"}); err != nil {
		t.Fatal(err)
	}
	if seen.State != model.StackNotInitialized || len(seen.Resets) != 2 {
		t.Fatalf("after the second reset: %+v", seen)
	}
	for _, m := range seen.MachineDocs {
		if m.State != provider.NotInitialized {
			t.Errorf("machine %s is %s", m.Label, m.State)
		}
	}
	if err := e.Server.Store().Stacks().Set(t.Context(), "stack-r", store.StackSet{TFJobID: new("tf-1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.StackReset(t.Context(), api.StackResetParams{StackID: "stack-r", State: "NotInitialized", Reason: "x"}); !errors.Is(err, kite.ErrState) {
		t.Fatalf("reset to NotInitialized of a stack terraform ran for: %v", err)
	}
}

// TestCancelRequestedThroughAnotherKloud: a cancel recorded in the store by another replica
// (job.cancel there cannot reach this process's job context) stops the job here too, at its
// next heartbeat, and the stack ends Failed.
func TestCancelRequestedThroughAnotherKloud(t *testing.T) {
	t.Parallel()
	f, g := newGatedFlow(t, dummy.Options{})
	f.credential()
	sid, _ := f.stack(f.template(oneVM))
	g.close("apply")
	job := f.apply(sid, false)
	g.waitEntered(t, "apply")
	if _, err := f.Server.Store().Jobs().RequestCancel(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if last := f.follow(job); last.Status != "cancelled" {
		t.Fatalf("build cancelled elsewhere: %+v", last)
	}
	t.Logf("stopped %s after the cancel was recorded", time.Since(start))
	f.settled(sid, model.StackFailed)
}
