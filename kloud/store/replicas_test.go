package store_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// Several kloud replicas on one store (issue 24): each test opens two stores (two replicas, each
// its own instance id and connection pool) on one `kloud store serve` (storetest.Serve), the
// server that executes its clients' commands one at a time, and races them.

// replicas opens n stores on one store server, sharing clock c (nil: the real time).
func replicas(t *testing.T, n int, c *clock, o store.Options) []*store.Store {
	t.Helper()
	o.MongoURL, o.SecretKey, o.ServerSelectionTimeout = storetest.Serve(t), make([]byte, 32), time.Minute
	if c != nil {
		o.Now = c.Now
	}
	out := make([]*store.Store, n)
	for i := range out {
		out[i] = storetest.Open(t, o)
	}
	return out
}

// TestJobRunsOnOneReplica: a queued job started by two replicas at once (8 tries each) is run by
// exactly one; once its runner's lease lapses (the replica died or stalled), the other takes it
// over (Orphans, Start: attempt 2), and the first one's late progress and finish change nothing
// (ErrLeaseLost) while the new runner's finish stands.
func TestJobRunsOnOneReplica(t *testing.T) {
	t.Parallel()
	c := newClock()
	rs := replicas(t, 2, c, store.Options{JobLeaseTTL: 30 * time.Second})
	a, b := rs[0], rs[1]
	ctx := ctxT(t)
	id, err := a.Jobs().Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s1", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	var won atomic.Int32
	var wg sync.WaitGroup
	for i := range 16 {
		s := rs[i%2]
		wg.Go(func() {
			_, err := s.Jobs().Start(ctx, id, s.InstanceID())
			switch {
			case err == nil:
				won.Add(1)
			case !errors.Is(err, store.ErrLocked):
				t.Errorf("start: %v", err)
			}
		})
	}
	wg.Wait()
	j, err := a.Jobs().Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// Start renews the claim of the runner that holds it, so the winner's own tries also
	// succeed; what matters is that one replica holds it and no other took it.
	var runner, other *store.Store
	switch j.Runner {
	case a.InstanceID():
		runner, other = a, b
	case b.InstanceID():
		runner, other = b, a
	default:
		t.Fatalf("runner %q is neither replica", j.Runner)
	}
	if j.Attempt < 1 || won.Load() < 1 {
		t.Fatalf("job %+v, %d starts won", j, won.Load())
	}
	if _, err := other.Jobs().Start(ctx, id, other.InstanceID()); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("the other replica took a live job: %v", err)
	}
	attempt := j.Attempt

	// The runner stops renewing (killed, or stalled): after the lease the other resumes it.
	c.Advance(31 * time.Second)
	orphans, err := other.Jobs().Orphans(ctx, other.Now())
	if err != nil || len(orphans) != 1 || orphans[0].ID != id {
		t.Fatalf("orphans %+v, %v", orphans, err)
	}
	j2, err := other.Jobs().Start(ctx, id, other.InstanceID())
	if err != nil || j2.Attempt != attempt+1 || j2.Runner != other.InstanceID() {
		t.Fatalf("take over: %+v %v", j2, err)
	}
	// The first runner wakes up: its writes are refused, its heartbeat says it lost the job.
	if err := runner.Jobs().ProgressRun(ctx, id, runner.InstanceID(), 50, "Building", "late"); !errors.Is(err, store.ErrState) {
		t.Fatalf("late progress of the old runner: %v", err)
	}
	if err := runner.Jobs().Heartbeat(ctx, id, runner.InstanceID()); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("late heartbeat of the old runner: %v", err)
	}
	if err := runner.Jobs().FinishRun(ctx, id, runner.InstanceID(), errors.New("old run failed"), store.Doc{}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("late finish of the old runner: %v", err)
	}
	if err := other.Jobs().ProgressRun(ctx, id, other.InstanceID(), 90, "Building", "resumed"); err != nil {
		t.Fatal(err)
	}
	if err := other.Jobs().FinishRun(ctx, id, other.InstanceID(), nil, store.Doc{}); err != nil {
		t.Fatal(err)
	}
	j, err = a.Jobs().Get(ctx, id)
	if err != nil || j.Status != store.JobSucceeded || j.Runner != other.InstanceID() || j.Message != "resumed" {
		t.Fatalf("job at the end: %+v %v", j, err)
	}
}

// TestAttemptsAcrossReplicas: failed logins are counted in the store: 2 replicas × 6 goroutines
// taking attempts of one key at once let exactly the limit (5) through, the rest are told how
// long to wait; another key is not affected; a reset (a success) on one replica frees the key on
// the other; a window that ended starts a new one.
func TestAttemptsAcrossReplicas(t *testing.T) {
	t.Parallel()
	c := newClock()
	rs := replicas(t, 2, c, store.Options{})
	ctx := ctxT(t)
	const limit, window = 5, time.Minute
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for i := range 12 {
		s := rs[i%2]
		wg.Go(func() {
			wait, err := s.Attempts().Take(ctx, "login/bob\x00127.0.0.1", limit, window)
			switch {
			case err != nil:
				t.Errorf("take: %v", err)
			case wait == 0:
				ok.Add(1)
			case wait > window:
				t.Errorf("wait %v is longer than the window", wait)
			default:
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("12 attempts at once through 2 replicas: %d let through, %d refused (limit %d)", ok.Load(), refused.Load(), limit)
	if ok.Load() != limit || refused.Load() != 12-limit {
		t.Fatalf("%d attempts let through, %d refused; want %d and %d", ok.Load(), refused.Load(), limit, 12-limit)
	}
	if wait, err := rs[1].Attempts().Take(ctx, "login/alice\x00127.0.0.1", limit, window); err != nil || wait != 0 {
		t.Fatalf("another key: %v %v", wait, err)
	}
	if err := rs[0].Attempts().Reset(ctx, "login/bob\x00127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if wait, err := rs[1].Attempts().Take(ctx, "login/bob\x00127.0.0.1", limit, window); err != nil || wait != 0 {
		t.Fatalf("after a reset on the other replica: %v %v", wait, err)
	}
	for range limit - 1 {
		rs[0].Attempts().Take(ctx, "login/bob\x00127.0.0.1", limit, window)
	}
	c.Advance(10 * time.Second)
	if wait, err := rs[1].Attempts().Take(ctx, "login/bob\x00127.0.0.1", limit, window); err != nil || wait != 50*time.Second {
		t.Fatalf("full window: wait %v (want 50s), %v", wait, err)
	}
	c.Advance(51 * time.Second)
	if wait, err := rs[1].Attempts().Take(ctx, "login/bob\x00127.0.0.1", limit, window); err != nil || wait != 0 {
		t.Fatalf("after the window: %v %v", wait, err)
	}
	if n, err := rs[0].Attempts().Prune(ctx, c.Now().Add(2*window), store.PruneOptions{}); err != nil || n != 2 {
		t.Fatalf("prune: %d %v", n, err)
	}
}

// TestLeaseOneHolderAcrossReplicas: 2 replicas × 8 goroutines, each a different owner, acquire
// one named lease (a sweep's) at once, 20 rounds: each round exactly one holds it.
func TestLeaseOneHolderAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2, nil, store.Options{})
	ctx := ctxT(t)
	for round := range 20 {
		name := fmt.Sprintf("sweep/gc-%d", round)
		var won atomic.Int32
		var wg sync.WaitGroup
		for i := range 16 {
			s := rs[i%2]
			wg.Go(func() {
				_, err := s.AcquireLease(ctx, name, fmt.Sprintf("sweep-%d", i), time.Minute)
				switch {
				case err == nil:
					won.Add(1)
				case !errors.Is(err, store.ErrLocked):
					t.Errorf("acquire: %v", err)
				}
			})
		}
		wg.Wait()
		if won.Load() != 1 {
			t.Fatalf("round %d: %d holders of %s", round, won.Load(), name)
		}
	}
}

// TestPluginPresence: a plugin's record names the replica and session of its newest
// registration. A connection that closes removes its own record only (the plugin registered
// again on the other replica meanwhile: that record stays), and a replica's sweep removes what
// it held.
func TestPluginPresence(t *testing.T) {
	t.Parallel()
	rs := replicas(t, 2, nil, store.Options{})
	a, b := rs[0].Plugins(), rs[1].Plugins()
	ctx := t.Context()
	if err := a.Set(ctx, store.PluginRecord{Name: "remote", Replica: "A", Session: "s1", Manifest: `{"name":"remote"}`, Version: "1"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Set(ctx, store.PluginRecord{Name: "remote", Replica: "B", Session: "s2", Manifest: `{"name":"remote"}`, Version: "2"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Remove(ctx, "remote", "s1"); ok || err != nil { // A's connection closes late
		t.Fatalf("removing the replaced session: %v %v", ok, err)
	}
	got, err := a.Get(ctx, "remote")
	if err != nil || got.Replica != "B" || got.Session != "s2" || got.Version != "2" || got.ConnectedAt.IsZero() {
		t.Fatalf("the record after A's late close: %+v %v", got, err)
	}
	if err := a.Set(ctx, store.PluginRecord{Name: "other", Replica: "A", Session: "s3", Manifest: "{}"}); err != nil {
		t.Fatal(err)
	}
	if n, err := a.RemoveReplica(ctx, "B"); n != 1 || err != nil {
		t.Fatalf("sweeping B: %d %v", n, err)
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "other" {
		t.Fatalf("records after B's sweep: %+v %v", list, err)
	}
	if _, err := b.Get(ctx, "remote"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("B's record after its sweep: %v", err)
	}
	if err := a.Set(ctx, store.PluginRecord{Name: "x"}); err == nil {
		t.Error("a record without a replica and session was written")
	}
}
