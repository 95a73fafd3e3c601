package store_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// TestPoolClaims: 20 users claim at once from a pool of 5 built stacks (beside them: a stack of
// the pool's older revision, one still building, one already claimed, another pool's), through
// two replicas on one store server: exactly 5 claims succeed, each a different stack of the
// pool's revision, oldest first, each now the claimer's with its machines; the other 15 find
// none ready. The same on the embedded store (one process).
func TestPoolClaims(t *testing.T) {
	t.Parallel()
	t.Run("two replicas", func(t *testing.T) {
		t.Parallel()
		poolClaims(t, replicas(t, 2, nil, store.Options{}))
	})
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		poolClaims(t, []*store.Store{storetest.New(t)})
	})
}

func poolClaims(t *testing.T, rs []*store.Store) {
	ctx := t.Context()
	s := rs[0]
	if err := s.Pools().Set(ctx, model.Pool{ID: model.PoolID("tpl", ""), Team: "dev", TemplateID: "tpl", Size: 5, UpdatedBy: "admin"}); err != nil {
		t.Fatal(err)
	}
	base := time.Now().UTC().Truncate(time.Millisecond)
	add := func(id, pool, owner, state string, rev int, job string, age time.Duration) {
		t.Helper()
		m := model.Machine{ID: id + "-m", StackID: id, Label: "vm", Provider: "dummy", Owner: owner, Team: "dev", State: "running"}
		if err := s.Machines().InsertMany(ctx, []model.Machine{m}); err != nil {
			t.Fatal(err)
		}
		st := model.Stack{ID: id, Team: "dev", Owner: owner, TemplateID: "tpl", TemplateRev: rev, Pool: pool, State: state, JobID: job,
			Machines: []string{m.ID}, CreatedAt: base.Add(-age), UpdatedAt: base}
		if err := s.Stacks().Insert(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		add(fmt.Sprintf("ready%d", i), "tpl", model.PoolOwner, model.StackInitialized, 2, fmt.Sprintf("build%d", i), time.Duration(10-i)*time.Minute) // a built stack keeps its last job's id
	}
	add("stale", "tpl", model.PoolOwner, model.StackInitialized, 1, "", time.Hour)
	add("building", "tpl", model.PoolOwner, model.StackBuilding, 2, "job1", time.Hour)
	add("claimed", "tpl", "zoe", model.StackInitialized, 2, "", time.Hour)
	add("other", "tpl/big", model.PoolOwner, model.StackInitialized, 2, "", time.Hour)
	if got, err := s.Stacks().OfPool(ctx, "tpl"); err != nil || len(got) != 7 {
		t.Fatalf("OfPool: %d stacks, %v; want the 5 ready, the stale and the building one", len(got), err)
	}

	type claim struct {
		user string
		st   model.Stack
		ok   bool
	}
	var (
		mu     sync.Mutex
		claims []claim
		wg     sync.WaitGroup
	)
	start := make(chan struct{})
	for i := range 20 {
		user := fmt.Sprintf("user%d", i)
		r := rs[i%len(rs)]
		wg.Go(func() {
			<-start
			st, ok, err := r.Stacks().Claim(ctx, "tpl", 2, user, "", store.NewID())
			if err != nil {
				t.Errorf("%s: %v", user, err)
				return
			}
			if ok {
				if err := r.Machines().SetOwner(ctx, st.ID, user); err != nil {
					t.Errorf("%s: %v", user, err)
				}
			}
			mu.Lock()
			claims = append(claims, claim{user, st, ok})
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	won := map[string]string{} // stack → user
	for _, c := range claims {
		if !c.ok {
			continue
		}
		if prev, dup := won[c.st.ID]; dup {
			t.Errorf("stack %s claimed twice: by %s and %s", c.st.ID, prev, c.user)
		}
		won[c.st.ID] = c.user
		if c.st.Owner != c.user || c.st.ClaimedAt.IsZero() || c.st.Pool != "tpl" {
			t.Errorf("%s's claim answered %+v", c.user, c.st)
		}
	}
	if len(won) != 5 {
		t.Fatalf("%d claims succeeded (%v), want 5", len(won), won)
	}
	for i := range 5 {
		id := fmt.Sprintf("ready%d", i)
		user, ok := won[id]
		if !ok {
			t.Errorf("%s was not claimed", id)
			continue
		}
		st, err := s.Stacks().Get(ctx, id)
		if err != nil || st.Owner != user {
			t.Errorf("%s after the claims: %+v %v, want %s's", id, st, err, user)
		}
		m, err := s.Machines().Get(ctx, id+"-m")
		if err != nil || m.Owner != user {
			t.Errorf("%s's machine after the claims: owner %q %v, want %s", id, m.Owner, err, user)
		}
	}
	for _, id := range []string{"stale", "building", "other"} {
		if st, _ := s.Stacks().Get(ctx, id); st.Owner != model.PoolOwner {
			t.Errorf("%s was claimed: %+v", id, st)
		}
	}
	if got, _ := s.Stacks().OfPool(ctx, "tpl"); len(got) != 2 {
		t.Errorf("OfPool after the claims: %d stacks, want the stale and the building one", len(got))
	}
	// A claim of an empty pool finds nothing.
	if _, ok, err := s.Stacks().Claim(ctx, "tpl", 2, "late", "", store.NewID()); ok || err != nil {
		t.Errorf("a claim after the pool ran dry: %v %v", ok, err)
	}
}
