package kloud_test

import (
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestPoolClaim: an administrator orders a pool of 2 prebuilt stacks of a template; kloud builds
// them as kloud-pool's; alice's stack.create takes one, built, at once (claimed), its machines
// hand over to her agent keys (new kite ids, connected, hers), and the pool builds another; the
// pool set to 0 destroys its idle stacks and leaves alice's.
func TestPoolClaim(t *testing.T) {
	t.Parallel()
	f := newFlow(t, dummy.Options{})
	f.credential()
	tid := f.template(twoVMs)
	admin := f.Client(kloud.Admin)
	ctx := t.Context()
	if _, err := admin.PoolSet(ctx, api.PoolSetParams{TemplateID: tid, Size: 2}); err != nil {
		t.Fatal(err)
	}
	pool := func() api.PoolView {
		t.Helper()
		res, err := admin.PoolList(ctx, api.PoolListParams{})
		if err != nil || len(res.Pools) != 1 {
			t.Fatalf("pool.list: %+v %v", res, err)
		}
		return res.Pools[0]
	}
	var last api.PoolView
	testutil.Eventually(t, 4*time.Minute, func() bool { last = pool(); return last.Ready == 2 }, "the pool did not fill")
	t.Logf("the pool filled: %+v", last)

	before := time.Now()
	res, err := f.client().StackCreate(ctx, api.StackPlanParams{TemplateID: tid})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stack.create from the pool: %s", time.Since(before).Round(time.Millisecond))
	if !res.Claimed || res.Stack.Owner != "alice" || res.Stack.State != model.StackInitialized || res.Stack.Pool != tid {
		t.Fatalf("stack.create with a pool ready: claimed %v, %+v", res.Claimed, res.Stack)
	}
	old := map[string]string{}
	for _, m := range res.Machines {
		old[m.ID] = m.KiteID
	}
	testutil.Eventually(t, 2*time.Minute, func() bool {
		for _, m := range f.machines(res.Stack.ID) {
			if m.Owner != "alice" || m.KiteID == old[m.ID] || m.Agent.Status != model.AgentConnected {
				return false
			}
		}
		return true
	}, "the claimed stack's machines were not handed over")
	t.Logf("claimed and handed over: %s", time.Since(before).Round(time.Millisecond))
	testutil.Eventually(t, 4*time.Minute, func() bool { last = pool(); return last.Ready == 2 && last.Claimed == 1 }, "the pool did not refill")
	t.Logf("the pool refilled: %+v", last)

	if _, err := admin.PoolSet(ctx, api.PoolSetParams{TemplateID: tid, Size: 0}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 4*time.Minute, func() bool { last = pool(); return last.Ready+last.Building+last.Stale+last.Failed == 0 }, "the emptied pool kept stacks")
	if st, err := f.client().StackDescribe(ctx, api.StackRef{StackID: res.Stack.ID}); err != nil || st.Stack.Owner != "alice" || st.Stack.State != model.StackInitialized {
		t.Fatalf("alice's claimed stack after the pool emptied: %+v %v", st.Stack, err)
	}
	job, err := f.client().StackApply(ctx, api.StackApplyParams{StackID: res.Stack.ID, Destroy: true})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(job.JobID); last.Status != "succeeded" {
		t.Fatalf("destroy of the claimed stack: %+v", last)
	}
}
