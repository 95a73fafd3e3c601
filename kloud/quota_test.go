package kloud_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// oneMachine is a template of one dummy machine.
const oneMachine = `resource "terraform_data" "vm" {
  count = 1
  input = "#!/bin/bash\necho hi\n"
}
`

// refusedQuota checks a quota refusal: -32008 of type quotaExceeded naming the limit, the use
// and the request.
func refusedQuota(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	var ke *kite.Error
	if !errors.Is(err, kite.ErrTooLarge) || !errors.As(err, &ke) || ke.Type() != api.QuotaCode {
		t.Fatalf("%s: %v, want a quota refusal (-32008 %s)", what, err, api.QuotaCode)
	}
	for _, w := range append(want, "kloud quota set") {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", what, err, w)
		}
	}
	t.Logf("%s: refused: %v", what, err)
}

// jobCount is how many jobs stack sid has.
func (f *flowEnv) jobCount(sid string) int {
	f.t.Helper()
	res, err := f.client().JobList(f.t.Context(), api.JobListParams{Target: "stack/" + sid})
	if err != nil {
		f.t.Fatal(err)
	}
	return len(res.Jobs)
}

// TestQuotaRefuses: with alice's quota at 2 machines and 2 built, stack.plan, stack.create,
// stack.apply of a third stack and stack.scale of a built one are refused with the limit, the
// use and the request, and start no job and change no stack; quota.show gives the numbers; a
// team's quota refuses as well; only administrators set quotas.
func TestQuotaRefuses(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{})
	f.credential()
	ctx := t.Context()
	c, admin := f.client(), f.Client(kloud.Admin)
	tid := f.template(oneMachine)

	if _, err := c.QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "alice"}, Limit: api.Quota{Machines: 100}}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("quota.set by alice: %v, want -32002", err)
	}
	if _, err := admin.QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "alice"}, Limit: api.Quota{Machines: 2}}); err != nil {
		t.Fatal(err)
	}
	a, _ := f.stack(tid)
	b, _ := f.stack(tid)
	third, _ := f.stack(tid) // NotInitialized stacks hold nothing
	ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: a})
	f.jobOK("build a", ref, err)
	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: b})
	f.jobOK("build b", ref, err)

	st, err := c.QuotaShow(ctx, api.QuotaShowParams{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (api.QuotaStatus{Subject: "user/alice", Limit: api.Quota{Machines: 2}, Used: api.Quota{Machines: 2}}); st != want {
		t.Fatalf("quota.show: %+v, want %+v", st, want)
	}

	const msg = "quota of user alice exceeded: machines: the limit is 2, 2 in use, this asks for 1"
	_, err = c.StackPlan(ctx, api.StackPlanParams{TemplateID: tid})
	refusedQuota(t, "stack.plan", err, msg)
	_, err = c.StackCreate(ctx, api.StackPlanParams{TemplateID: tid})
	refusedQuota(t, "stack.create", err, msg)
	_, err = c.StackApply(ctx, api.StackApplyParams{StackID: third})
	refusedQuota(t, "stack.apply", err, msg)
	if n := f.jobCount(third); n != 0 {
		t.Fatalf("stack.apply refused by the quota started %d jobs", n)
	}
	f.settled(third, model.StackNotInitialized)
	_, err = c.StackScale(ctx, api.StackScaleParams{StackID: a, Resource: "vm", Count: 2})
	refusedQuota(t, "stack.scale to 2", err, "machines: the limit is 2, 1 in use, this asks for 2")
	if n := f.jobCount(a); n != 1 {
		t.Fatalf("stack.scale refused by the quota: %d jobs of the stack, want 1", n)
	}
	if view := f.settled(a, model.StackInitialized); len(view.Machines) != 1 || view.Diverged {
		t.Fatalf("stack.scale refused by the quota changed the stack: %d machines, diverged %v", len(view.Machines), view.Diverged)
	}

	// The team's quota: alice's own is lifted, her team's holds.
	if _, err := admin.QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "alice"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{Team: model.DefaultTeam}, Limit: api.Quota{Machines: 2, Cores: 8}}); err != nil {
		t.Fatal(err)
	}
	_, err = c.StackApply(ctx, api.StackApplyParams{StackID: third})
	refusedQuota(t, "stack.apply under the team's quota", err, "quota of team "+model.DefaultTeam+" exceeded: machines: the limit is 2, 2 in use, this asks for 1", "--team "+model.DefaultTeam)
	st, err = c.QuotaShow(ctx, api.QuotaShowParams{QuotaSubject: api.QuotaSubject{Team: model.DefaultTeam}})
	if err != nil {
		t.Fatal(err)
	}
	if want := (api.QuotaStatus{Subject: "team/" + model.DefaultTeam, Limit: api.Quota{Machines: 2, Cores: 8}, Used: api.Quota{Machines: 2}, Left: api.Quota{Cores: 8}}); st != want {
		t.Fatalf("quota.show of the team: %+v, want %+v", st, want)
	}

	// Room again once a stack is destroyed.
	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: b, Destroy: true})
	f.jobOK("destroy b", ref, err)
	ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: third})
	f.jobOK("build the third stack after a destroy", ref, err)
	for _, sid := range []string{a, third} {
		ref, err = c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
		f.jobOK("destroy", ref, err)
	}
}

// TestQuotaConcurrentApplies: ten concurrent stack.apply of one user whose quota is 3 machines
// (one machine per stack) build exactly 3 stacks; the 7 others are refused by the quota.
//
// Not parallel: its ten clients at once share the embedded store's one connection, whose
// checkout gives up after 1.5 s; beside other tests on a loaded machine calls timed out.
func TestQuotaConcurrentApplies(t *testing.T) {
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{})
	f.credential()
	ctx := t.Context()
	c := f.client()
	tid := f.template(oneMachine)
	var sids []string
	for range 10 {
		sid, _ := f.stack(tid)
		sids = append(sids, sid)
	}
	if _, err := f.Client(kloud.Admin).QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "alice"}, Limit: api.Quota{Machines: 3}}); err != nil {
		t.Fatal(err)
	}

	refs := make([]api.JobRef, len(sids))
	errs := make([]error, len(sids))
	var wg sync.WaitGroup
	for i, sid := range sids {
		wg.Go(func() {
			refs[i], errs[i] = api.NewClient(f.Dial("alice")).StackApply(ctx, api.StackApplyParams{StackID: sid})
		})
	}
	wg.Wait()
	var built []string
	for i, err := range errs {
		if err != nil {
			refusedQuota(t, "stack.apply "+sids[i], err, "machines: the limit is 3, 3 in use, this asks for 1")
			continue
		}
		f.jobOK("build "+sids[i], refs[i], nil)
		built = append(built, sids[i])
	}
	if len(built) != 3 {
		t.Errorf("%d of 10 concurrent applies started, want 3 (the quota)", len(built))
	}
	st, err := c.QuotaShow(ctx, api.QuotaShowParams{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Used.Machines != int64(len(built)) || st.Used.Machines > 3 {
		t.Errorf("quota.show: %+v, want 3 machines used", st)
	}
	// A scale within a raised quota: the job's own check passes under the quota's lease.
	if _, err := f.Client(kloud.Admin).QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "alice"}, Limit: api.Quota{Machines: 4}}); err != nil {
		t.Fatal(err)
	}
	if len(built) > 0 {
		ref, err := c.StackScale(ctx, api.StackScaleParams{StackID: built[0], Resource: "vm", Count: 2})
		f.jobOK("scale to 2 within the quota", ref, err)
		if st, err := c.QuotaShow(ctx, api.QuotaShowParams{}); err != nil || st.Used.Machines != int64(len(built))+1 {
			t.Errorf("quota.show after the scale: %+v, %v", st, err)
		}
		_, err = c.StackScale(ctx, api.StackScaleParams{StackID: built[0], Resource: "vm", Count: 3})
		refusedQuota(t, "scale to 3 over the quota", err, "machines: the limit is 4, 2 in use, this asks for 3")
	}
	for _, sid := range built {
		ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
		f.jobOK("destroy "+sid, ref, err)
	}
}

// TestQuotaConcurrentCreateAndApply: ten clients of one user, each stack.create then (all
// together) stack.apply of a template of two dummy machines, under a quota of 5 machines: two stacks are built (4
// machines), the others are refused at create or apply with the quota's message, and at no moment
// (sampled during the race) do more than 5 of her machines exist, in kloud's records or as
// machines of the provider.
//
// Not parallel: its ten clients at once share the embedded store's one connection, whose
// checkout gives up after 1.5 s; beside other tests on a loaded machine calls timed out.
func TestQuotaConcurrentCreateAndApply(t *testing.T) {
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{})
	f.credential()
	ctx := t.Context()
	c := f.client()
	tid := f.template(twoVMs)
	const limit = 5
	if _, err := f.Client(kloud.Admin).QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{User: "alice"}, Limit: api.Quota{Machines: limit}}); err != nil {
		t.Fatal(err)
	}
	// built counts alice's machines that are more than a plan, in kloud's records and in the
	// dummy provider's directory (a machine's root is made when it boots).
	built := func() (records, roots int) {
		res, err := c.MachineList(ctx, api.MachineListParams{})
		if err != nil {
			t.Errorf("machine.list: %v", err)
		}
		for _, m := range res.Machines {
			if m.State != provider.NotInitialized && m.State != provider.Terminated {
				records++
			}
		}
		stacks, _ := os.ReadDir(f.dir)
		for _, st := range stacks {
			ms, _ := os.ReadDir(filepath.Join(f.dir, st.Name()))
			roots += len(ms)
		}
		return records, roots
	}
	stop := make(chan struct{})
	sampled := make(chan int, 1)
	// The sampler stops before the test ends, also when it fails early (a t.Errorf of the
	// sampler's after the test ended panics).
	var samples int
	stopSampling := sync.OnceFunc(func() { close(stop); samples = <-sampled })
	t.Cleanup(stopSampling)
	go func() {
		n := 0
		defer func() { sampled <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if r, d := built(); r > limit || d > limit {
				t.Errorf("during the race: %d machine records and %d machine roots, over the quota of %d", r, d, limit)
			}
			n++
		}
	}()

	type result struct {
		sid string
		ref api.JobRef
		err error
	}
	results := make([]result, 10)
	var wg, created sync.WaitGroup
	created.Add(len(results))
	for i := range results {
		wg.Go(func() {
			cl := api.NewClient(f.Dial("alice"))
			// The ten creates' plans take turns (one template, one user): the last one waits
			// for nine plans, longer than a call's default 30 s on a loaded machine.
			cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
			defer cancel()
			res, err := cl.StackCreate(cctx, api.StackPlanParams{TemplateID: tid})
			// The applies start together, once every create has answered (the creates' plans of
			// one template take turns, so applies right after them would not overlap).
			created.Done()
			created.Wait()
			if err != nil {
				results[i].err = err
				return
			}
			results[i].sid = res.Stack.ID
			results[i].ref, results[i].err = cl.StackApply(ctx, api.StackApplyParams{StackID: res.Stack.ID})
		})
	}
	wg.Wait()
	var ok []string
	for _, r := range results {
		if r.err != nil {
			refusedQuota(t, "stack.create+apply "+r.sid, r.err, "quota of user alice exceeded: machines: the limit is 5, 4 in use, this asks for 2")
			continue
		}
		f.jobOK("build "+r.sid, r.ref, nil)
		ok = append(ok, r.sid)
	}
	stopSampling()
	t.Logf("%d samples during the race", samples)
	if len(ok) != 2 {
		t.Errorf("%d of 10 concurrent builds of 2 machines started under a quota of 5, want 2", len(ok))
	}
	if r, d := built(); r != 4 || d != 4 {
		t.Errorf("after the builds: %d machine records, %d machine roots, want 4", r, d)
	}
	if st, err := c.QuotaShow(ctx, api.QuotaShowParams{}); err != nil || st.Used.Machines != 4 {
		t.Errorf("quota.show: %+v %v, want 4 machines used", st, err)
	}
	for _, sid := range ok {
		ref, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: true})
		f.jobOK("destroy "+sid, ref, err)
	}
}
