package kloud_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestPoolClaim: an administrator orders a pool of 2 prebuilt stacks of a template (by its
// schedule: its size is 0 outside a window that holds at all times); kloud builds
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
	// Size 0 but for its schedule's window, which holds at all times (from midnight to midnight).
	if _, err := admin.PoolSet(ctx, api.PoolSetParams{TemplateID: tid, Size: 0,
		Schedule: []model.PoolWindow{{Days: "daily", From: "00:00", To: "00:00", Size: 2}}}); err != nil {
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
	if last.Size != 0 || last.Current != 2 {
		t.Errorf("pool.list: size %d, now %d; want 0 and, by its schedule, 2", last.Size, last.Current)
	}
	t.Logf("the pool filled: %+v", last)

	// carol, of another team, cannot take a stack of this team's pool: the template is not hers.
	if _, err := admin.TeamCreate(ctx, api.TeamCreateParams{Slug: "other"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserAdd(ctx, api.UserAddParams{Username: "carol", Team: "other"}); err != nil {
		t.Fatal(err)
	}
	if res, err := f.Client("carol").StackCreate(ctx, api.StackPlanParams{TemplateID: tid}); err == nil {
		t.Fatalf("carol of another team created from the pool's template: claimed %v, %+v", res.Claimed, res.Stack)
	}
	if last = pool(); last.Ready != 2 || last.Claimed != 0 {
		t.Fatalf("the pool after carol's try: %+v", last)
	}

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
	// The pool's agent keys are revoked: what was built for the pool cannot act as the agent of
	// alice's machines, nor register as the pool's, again.
	testutil.Eventually(t, time.Minute, func() bool {
		for _, k := range old {
			if ok, err := f.Server.Store().Revocations().IsRevoked(ctx, k); !ok || err != nil || f.Server.Kontrol.Conn(k) != nil {
				return false
			}
		}
		return true
	}, "the pool's agent keys of the claimed machines were not revoked")
	// As a user would: apply the stack anyway. It is built; the apply changes no machine (same
	// ids, the new kite ids, hers) and its agents answer.
	handed := f.machines(res.Stack.ID)
	job, err := f.client().StackApply(ctx, api.StackApplyParams{StackID: res.Stack.ID})
	if err != nil {
		t.Fatalf("stack.apply of the claimed stack: %v", err)
	}
	if last := f.follow(job.JobID); last.Status != "succeeded" {
		t.Fatalf("stack.apply of the claimed stack: %+v", last)
	}
	for id, m := range f.machines(res.Stack.ID) {
		if h, ok := handed[id]; !ok || m.KiteID != h.KiteID || m.Owner != "alice" || m.Agent.Status != model.AgentConnected {
			t.Errorf("machine %s after an apply of the claimed stack: %+v (before: %+v)", m.Label, m, h)
		}
	}
	testutil.Eventually(t, 4*time.Minute, func() bool { last = pool(); return last.Ready == 2 && last.Claimed == 1 }, "the pool did not refill")
	t.Logf("the pool refilled: %+v", last)

	// A stack.create cut right after its claim (the claim is the store's; nothing after it ran:
	// no machines given, no job): a minute on, the pools reconciler starts the job the claim
	// recorded, and the machines are handed over.
	st := f.Server.Store()
	cut, ok, err := st.Stacks().Claim(ctx, tid, 1, "alice", "", store.NewID())
	if err != nil || !ok {
		t.Fatalf("claim in the store: %v %v", ok, err)
	}
	if _, err := st.Collection(store.CollStacks).UpdateOne(ctx, bson.M{"_id": cut.ID},
		bson.M{"$set": bson.M{"claimedAt": time.Now().Add(-2 * time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	poolKites := map[string]string{}
	for id, m := range f.machines(cut.ID) {
		poolKites[id] = m.KiteID
	}
	if _, err := admin.PoolSet(ctx, api.PoolSetParams{TemplateID: tid, Size: 0, // the same, and a reconciler pass now
		Schedule: []model.PoolWindow{{Days: "daily", From: "00:00", To: "00:00", Size: 2}}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, func() bool {
		ms := f.machines(cut.ID)
		for id, m := range ms {
			if m.Owner != "alice" || m.Agent.Status != model.AgentConnected || m.KiteID == poolKites[id] {
				return false
			}
		}
		return len(ms) == 2
	}, "the cut claim's machines were not handed over")
	if last := f.follow(cut.JobID); last.Status != "succeeded" { // the job the claim recorded
		t.Fatalf("the cut claim's job %s: %+v", cut.JobID, last)
	}

	if _, err := admin.PoolSet(ctx, api.PoolSetParams{TemplateID: tid, Size: 0}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 4*time.Minute, func() bool { last = pool(); return last.Ready+last.Building+last.Stale+last.Failed == 0 }, "the emptied pool kept stacks")
	if st, err := f.client().StackDescribe(ctx, api.StackRef{StackID: res.Stack.ID}); err != nil || st.Stack.Owner != "alice" || st.Stack.State != model.StackInitialized {
		t.Fatalf("alice's claimed stack after the pool emptied: %+v %v", st.Stack, err)
	}
	job, err = f.client().StackApply(ctx, api.StackApplyParams{StackID: res.Stack.ID, Destroy: true})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(job.JobID); last.Status != "succeeded" {
		t.Fatalf("destroy of the claimed stack: %+v", last)
	}
	// Run twice what users run twice: a second destroy of the claimed stack, gone, says so;
	// the pool deleted twice, the second time there is none to delete.
	if _, err := f.client().StackApply(ctx, api.StackApplyParams{StackID: res.Stack.ID, Destroy: true}); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("a second destroy of the claimed stack: %v, want not found", err)
	}
	if r, err := admin.PoolDelete(ctx, api.PoolRef{ID: last.ID}); err != nil || !r.Deleted {
		t.Fatalf("pool.delete: %+v %v", r, err)
	}
	if r, err := admin.PoolDelete(ctx, api.PoolRef{ID: last.ID}); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("pool.delete of a deleted pool: %+v %v, want not found", r, err)
	}
	if res, err := admin.PoolList(ctx, api.PoolListParams{}); err != nil || len(res.Pools) != 0 {
		t.Errorf("pool.list after the delete: %+v %v", res, err)
	}
}

// TestPoolConcurrentClaims: 20 stack.create calls at once against a pool of 5 ready stacks: 5
// take a prebuilt stack each (none taken twice), the other 15 create stacks to build, as
// without a pool. Pool stacks count against the team's pool quota only (its limit stops the
// pool at 5 though its size is 6), never the team's; a claimed stack counts against its user and
// team.
func TestPoolConcurrentClaims(t *testing.T) {
	t.Parallel()
	// The 15 creates that find no ready stack each plan the template at once: on a loaded host
	// (ci53, load 35) half of them took past kloud's default 2-minute plan timeout.
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{Limits: kloud.Limits{PlanTimeout: 10 * time.Minute}})
	f.credential()
	tid := f.template(oneVM)
	admin := f.Client(kloud.Admin)
	ctx := t.Context()
	if _, err := admin.QuotaSet(ctx, api.QuotaSetParams{QuotaSubject: api.QuotaSubject{Pool: model.DefaultTeam}, Limit: api.Quota{Machines: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.PoolSet(ctx, api.PoolSetParams{TemplateID: tid, Size: 6}); err != nil {
		t.Fatal(err)
	}
	var last api.PoolView
	testutil.Eventually(t, 5*time.Minute, func() bool {
		res, err := admin.PoolList(ctx, api.PoolListParams{})
		if err != nil || len(res.Pools) != 1 {
			t.Fatalf("pool.list: %+v %v", res, err)
		}
		last = res.Pools[0]
		return last.Ready == 5 && last.Building == 0
	}, "the pool did not fill to its quota")
	t.Logf("the pool filled to its quota: %+v", last)
	testutil.Eventually(t, time.Minute, func() bool {
		res, err := admin.PoolList(ctx, api.PoolListParams{})
		return err == nil && strings.Contains(res.Pools[0].Problem, "quota of pool default exceeded")
	}, "pool.list does not say the quota keeps the pool below its size")
	show := func(s api.QuotaSubject) int64 {
		t.Helper()
		st, err := admin.QuotaShow(ctx, api.QuotaShowParams{QuotaSubject: s})
		if err != nil {
			t.Fatal(err)
		}
		return st.Used.Machines
	}
	if p, team := show(api.QuotaSubject{Pool: model.DefaultTeam}), show(api.QuotaSubject{Team: model.DefaultTeam}); p != 5 || team != 0 {
		t.Fatalf("quota use before the claims: pool %d, team %d machines; want 5 and 0", p, team)
	}
	ready := map[string]bool{}
	sts, err := admin.StackList(ctx, api.StackListParams{All: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts.Stacks {
		if st.Pool == tid && st.Owner == model.PoolOwner && st.State == model.StackInitialized {
			ready[st.ID] = true
		}
	}
	if len(ready) != 5 {
		t.Fatalf("stack.list shows %d ready pool stacks, want 5", len(ready))
	}

	type result struct {
		res api.StackCreateResult
		err error
	}
	results := make(chan result, 20)
	for range 20 {
		go func() {
			res, err := f.client().StackCreate(ctx, api.StackPlanParams{TemplateID: tid})
			results <- result{res, err}
		}()
	}
	claimed, created := map[string]bool{}, 0
	for range 20 {
		r := <-results
		switch {
		case r.err != nil:
			t.Errorf("stack.create: %v", r.err)
		case r.res.Claimed:
			if claimed[r.res.Stack.ID] {
				t.Errorf("stack %s was claimed twice", r.res.Stack.ID)
			}
			claimed[r.res.Stack.ID] = true
			if r.res.Stack.Owner != "alice" || r.res.JobID == "" {
				t.Errorf("claimed stack: %+v (job %q)", r.res.Stack, r.res.JobID)
			}
		default:
			created++
			if r.res.Stack.State != model.StackNotInitialized || r.res.Stack.Pool != "" {
				t.Errorf("created stack: %+v", r.res.Stack)
			}
		}
	}
	t.Logf("20 creates at once: %d claimed, %d created to build", len(claimed), created)
	for id := range ready {
		if !claimed[id] {
			t.Errorf("ready pool stack %s was not claimed", id)
		}
	}
	// A stack the pool built during the creates may have been claimed too: only the 5 were
	// ready when they began.
	if len(claimed) < 5 || len(claimed)+created != 20 {
		t.Errorf("%d claimed and %d created, want 5 (or more, built meanwhile) and the rest", len(claimed), created)
	}
	testutil.Eventually(t, 4*time.Minute, func() bool {
		for id := range claimed {
			for _, m := range f.machines(id) {
				if m.Owner != "alice" || m.Agent.Status != model.AgentConnected {
					return false
				}
			}
		}
		return true
	}, "the claimed stacks' machines were not handed over")
	if team := show(api.QuotaSubject{Team: model.DefaultTeam}); team != int64(len(claimed)) {
		t.Errorf("the team's quota use after the claims: %d machines, want %d", team, len(claimed))
	}
}
