package load

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
)

// builtStack is a stack of one member, built or being built.
type builtStack struct {
	c     *api.Client
	stack string
	job   string
}

// TestLoadApplies: LOAD_APPLIES members (full 50, tiny 3) each apply a stack of one dummy
// machine (a real klient process of this host, booted through the real terraformer and
// terraform) at the same moment. Targets: 0 lost jobs, every job ends succeeded (none stuck,
// none failed), and the store agrees with the results: each stack built, its machine Running
// with its agent connected, no job of the stacks left queued or running. Then every stack is
// destroyed at once, with the same checks. It prints the time until all were done.
func TestLoadApplies(t *testing.T) {
	t.Parallel()
	n := size(t, "LOAD_APPLIES", 50, 3)
	k := startKloud(t)
	ctx := context.Background()
	keys := k.addUsers(ctx, k.admin(ctx), "builder", n, nil)
	stacks := make([]*builtStack, n)
	if err := fanOut(ctx, n, 8, func(ctx context.Context, i int) error {
		c, err := k.dial(ctx, keys[i], time.Minute)
		if err != nil {
			return fmt.Errorf("builder%d: dial: %w", i, err)
		}
		a := api.NewClient(c)
		cr, err := a.CredentialAdd(ctx, api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"abc123"}`)})
		if err != nil {
			return fmt.Errorf("builder%d: credential.add: %w", i, err)
		}
		tp, err := a.TemplateCreate(ctx, api.TemplateParams{Title: "demo", Files: machineTemplate(1, "load")})
		if err != nil {
			return fmt.Errorf("builder%d: template.create: %w", i, err)
		}
		pctx, cancel := planCall(ctx)
		st, err := a.StackCreate(pctx, api.StackPlanParams{TemplateID: tp.ID, Credentials: map[string]string{"dummy": cr.ID}})
		cancel()
		if err != nil {
			return fmt.Errorf("builder%d: stack.create: %w", i, err)
		}
		stacks[i] = &builtStack{c: a, stack: st.Stack.ID}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	took, slowest := runJobs(t, stacks, false)
	for i, s := range stacks {
		v, err := s.c.StackDescribe(ctx, api.StackRef{StackID: s.stack})
		if err != nil {
			t.Fatalf("builder%d: stack.describe: %v", i, err)
		}
		if len(v.MachineDocs) != 1 {
			t.Errorf("builder%d: stack %s (%s) has %d machines, want 1", i, s.stack, v.State, len(v.MachineDocs))
			continue
		}
		m := v.MachineDocs[0]
		if m.State != "Running" || m.Agent.Status != "connected" {
			t.Errorf("builder%d: stack %s (%s): machine %s is %s, agent %s, want Running and connected", i, s.stack, v.State, m.Label, m.State, m.Agent.Status)
		}
	}
	noneLeft(t, stacks)
	dtook, dslowest := runJobs(t, stacks, true)
	for i, s := range stacks {
		v, err := s.c.StackDescribe(ctx, api.StackRef{StackID: s.stack})
		if err == nil && len(v.MachineDocs) != 0 {
			t.Errorf("builder%d: stack %s (%s) still has %d machines after destroy", i, s.stack, v.State, len(v.MachineDocs))
		}
	}
	noneLeft(t, stacks)
	lost := "0 lost, 0 failed, 0 stuck"
	if t.Failed() {
		lost = "**FAILED** (see the test's log)"
	}
	report(fmt.Sprintf("| %d stacks of one dummy machine (klient process) applied at once, real terraformer | %s; store and results agree | all built %s after the calls (slowest job %s) | all destroyed at once: %s (slowest %s) | %s |",
		n, lost, took.Round(time.Millisecond), slowest.Round(time.Millisecond), dtook.Round(time.Millisecond), dslowest.Round(time.Millisecond), commit()))
}

// runJobs starts stack.apply (or its destroy) of every stack at once, waits for every job to
// end, fails the test for each that did not succeed, and returns the time until all ended and
// the longest job's own time (from its creation to its last update).
func runJobs(t *testing.T, stacks []*builtStack, destroy bool) (took, slowest time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	what := "apply"
	if destroy {
		what = "destroy"
	}
	start := time.Now()
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for i, s := range stacks {
		wg.Go(func() {
			ref, err := s.c.StackApply(ctx, api.StackApplyParams{StackID: s.stack, Destroy: destroy})
			if err != nil {
				t.Errorf("builder%d: stack.apply %s: %v", i, what, err)
				return
			}
			s.job = ref.JobID
			j := waitJob(ctx, s.c, ref.JobID)
			if j.Status != api.JobSucceeded {
				t.Errorf("builder%d: %s job %s of stack %s ended %q: %s %s\n%s", i, what, j.ID, s.stack, j.Status, j.Message, j.Error, strings.Join(j.Log, "\n"))
			}
			mu.Lock()
			slowest = max(slowest, j.UpdatedAt.Sub(j.CreatedAt))
			mu.Unlock()
		})
	}
	wg.Wait()
	return time.Since(start), slowest
}

// waitJob follows a job (job.watch) until it ends and returns it as job.get reads it then.
func waitJob(ctx context.Context, c *api.Client, id string) api.Job {
	for ctx.Err() == nil {
		w, err := c.JobWatch(ctx, api.JobRef{JobID: id})
		if err == nil {
			if !w.Job.Status.Done() {
				w.Wait(ctx)
			}
			w.Close()
		}
		j, err := c.JobGet(ctx, api.JobRef{JobID: id})
		if err == nil && j.Status.Done() {
			return j
		}
		kite.Sleep(ctx, time.Second) // the watch failed or ended early: follow it again
	}
	return api.Job{ID: id, Status: "not ended: " + api.JobStatus(ctx.Err().Error())}
}

// noneLeft fails the test if a job of the stacks is queued or running (stuck).
func noneLeft(t *testing.T, stacks []*builtStack) {
	t.Helper()
	for i, s := range stacks {
		r, err := s.c.JobList(context.Background(), api.JobListParams{Target: "stack/" + s.stack})
		if err != nil {
			t.Fatalf("builder%d: job.list: %v", i, err)
		}
		for _, j := range r.Jobs {
			if !j.Status.Done() {
				t.Errorf("builder%d: job %s (%s) of stack %s is %s", i, j.ID, j.Kind, s.stack, j.Status)
			}
		}
	}
}
