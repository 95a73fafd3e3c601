package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

// seedJobs creates n jobs on target (one target per job if target is ""), finishes them at
// the clock's current time, advancing the clock by step after each, and returns their ids in
// finishing order.
func seedJobs(t *testing.T, ctx context.Context, s *store.Store, clk *clock, n int, target string, step time.Duration) []string {
	t.Helper()
	var ids []string
	for i := range n {
		tg := target
		if tg == "" {
			tg = fmt.Sprintf("stack/gone%d-%s", i, store.NewID())
		}
		id, err := s.Jobs().Create(ctx, store.Job{Kind: "stack.apply", Target: tg, Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Jobs().Start(ctx, id, "r"); err != nil {
			t.Fatal(err)
		}
		if err := s.Jobs().Log(ctx, id, "line one", "line two"); err != nil {
			t.Fatal(err)
		}
		if err := s.Jobs().Finish(ctx, id, nil, store.Doc{}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		clk.Advance(step)
	}
	return ids
}

func jobIDs(t *testing.T, ctx context.Context, s *store.Store) []string {
	t.Helper()
	js, err := s.Jobs().List(ctx, store.JobFilter{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, j := range js {
		out = append(out, j.ID)
	}
	slices.Sort(out)
	return out
}

func sorted(ids ...[]string) []string {
	var out []string
	for _, l := range ids {
		out = append(out, l...)
	}
	slices.Sort(out)
	return out
}

// TestJobPrune: old finished jobs go; recent ones, queued and running ones (however old) and
// the newest job of a target that is kept stay.
func TestJobPrune(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now, JobLeaseTTL: time.Hour})
		js := s.Jobs()

		// Old and running / queued: created first, so they are the oldest of all.
		running, _ := js.Create(ctx, store.Job{Kind: "k", Target: "stack/run"})
		if _, err := js.Start(ctx, running, "r"); err != nil {
			t.Fatal(err)
		}
		queued, _ := js.Create(ctx, store.Job{Kind: "k", Target: "stack/queued"})
		old := seedJobs(t, ctx, s, clk, 5, "", time.Minute)
		// stack/kept: two old jobs; the newest of them stays because the target is kept.
		keptOld := seedJobs(t, ctx, s, clk, 2, "stack/kept", time.Minute)
		// stack/gone: two old jobs, target not kept: both go.
		goneOld := seedJobs(t, ctx, s, clk, 2, "stack/gone", time.Minute)
		cut := clk.Now()
		clk.Advance(time.Hour)
		recent := seedJobs(t, ctx, s, clk, 3, "", time.Minute)

		var asked []string
		keep := func(_ context.Context, target string) (bool, error) {
			asked = append(asked, target)
			return target == "stack/kept", nil
		}
		n, err := js.Prune(ctx, store.JobPrune{Before: cut, KeepLatest: keep})
		if err != nil {
			t.Fatal(err)
		}
		if n != int64(len(old)+1+len(goneOld)) {
			t.Fatalf("pruned %d, want %d", n, len(old)+1+len(goneOld))
		}
		want := sorted([]string{running, queued, keptOld[1]}, recent)
		if got := jobIDs(t, ctx, s); !slices.Equal(got, want) {
			t.Fatalf("left %v, want %v", got, want)
		}
		if !slices.Contains(asked, "stack/kept") || !slices.Contains(asked, "stack/gone") {
			t.Fatalf("KeepLatest asked about %v", asked)
		}
		// A finished job is gone for Get too (its log and progress were in it).
		if _, err := js.Get(ctx, old[0]); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("get pruned job: %v", err)
		}
		// Nothing left to prune: a second pass deletes nothing.
		if n, err := js.Prune(ctx, store.JobPrune{Before: cut, KeepLatest: keep}); err != nil || n != 0 {
			t.Fatalf("second prune: %d %v", n, err)
		}
	})
}

// TestJobPruneStoppedMidway: a prune cancelled after its first batch leaves exactly the old
// jobs it had not reached (the newest old ones) and every recent one; a second prune (a
// restart) finishes the work and loses nothing else.
func TestJobPruneStoppedMidway(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})
		js := s.Jobs()
		old := seedJobs(t, ctx, s, clk, 12, "", time.Minute)
		cut := clk.Now()
		clk.Advance(time.Hour)
		recent := seedJobs(t, ctx, s, clk, 4, "", time.Minute)
		running, _ := js.Create(ctx, store.Job{Kind: "k", Target: "stack/run"})
		if _, err := js.Start(ctx, running, "r"); err != nil {
			t.Fatal(err)
		}

		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var batches atomic.Int32
		n, err := js.Prune(pctx, store.JobPrune{Before: cut, PruneOptions: store.PruneOptions{Batch: 5, AfterBatch: func(int64) {
			if batches.Add(1) == 1 {
				cancel() // kloud stopped during the prune
			}
		}}})
		if !errors.Is(err, context.Canceled) || n != 5 {
			t.Fatalf("stopped prune: %d %v", n, err)
		}
		// The five oldest went; the seven newer old ones, the recent and the running job stay.
		want := sorted(old[5:], recent, []string{running})
		if got := jobIDs(t, ctx, s); !slices.Equal(got, want) {
			t.Fatalf("after a stopped prune: left %v, want %v", got, want)
		}
		n, err = js.Prune(ctx, store.JobPrune{Before: cut, PruneOptions: store.PruneOptions{Batch: 5}})
		if err != nil || n != 7 {
			t.Fatalf("prune again: %d %v", n, err)
		}
		want = sorted(recent, []string{running})
		if got := jobIDs(t, ctx, s); !slices.Equal(got, want) {
			t.Fatalf("after the second prune: left %v, want %v", got, want)
		}
	})
}

// TestPruneRevocationsKitesLeases: expired revocations, stale kite records and long-expired
// leases go in batches; permanent revocations, fresh records (touched by their replica) and
// live leases stay.
func TestPruneRevocationsKitesLeases(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})
		now := clk.Now()
		rv := s.Revocations()
		for i := range 7 {
			if err := rv.Revoke(ctx, fmt.Sprintf("old%d", i), now.Add(time.Duration(i)*time.Minute), "t"); err != nil {
				t.Fatal(err)
			}
		}
		if err := rv.Revoke(ctx, "forever", time.Time{}, "kite key"); err != nil {
			t.Fatal(err)
		}
		if err := rv.Revoke(ctx, "valid", now.Add(48*time.Hour), "t"); err != nil {
			t.Fatal(err)
		}
		var seen []int64
		n, err := rv.Prune(ctx, now.Add(time.Hour), store.PruneOptions{Batch: 3, AfterBatch: func(d int64) { seen = append(seen, d) }})
		if err != nil || n != 7 || !slices.Equal(seen, []int64{3, 6, 7}) {
			t.Fatalf("prune revocations: %d %v (batches %v)", n, err, seen)
		}
		list, err := rv.ListRevoked(ctx)
		if err != nil || len(list) != 2 {
			t.Fatalf("revocations left: %v %v", list, err)
		}

		k := s.Kites()
		for i := range 4 {
			r := "dead"
			if i%2 == 0 {
				r = "live"
			}
			if err := k.Upsert(ctx, store.KiteRecord{ID: fmt.Sprintf("k%d", i), Replica: r}); err != nil {
				t.Fatal(err)
			}
		}
		clk.Advance(48 * time.Hour)
		if n, err := k.TouchReplica(ctx, "live", clk.Now()); err != nil || n != 2 {
			t.Fatalf("touch: %d %v", n, err)
		}
		if n, err := k.Prune(ctx, clk.Now().Add(-24*time.Hour), store.PruneOptions{}); err != nil || n != 2 {
			t.Fatalf("prune kites: %d %v", n, err)
		}
		left, err := k.Find(ctx, nil)
		if err != nil || len(left) != 2 || left[0].Replica != "live" || left[1].Replica != "live" {
			t.Fatalf("kites left: %v %v", left, err)
		}

		if _, err := s.AcquireLease(ctx, "old", "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Hour)
		if _, err := s.AcquireLease(ctx, "live", "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if n, err := s.PruneLeases(ctx, clk.Now().Add(-time.Hour), store.PruneOptions{}); err != nil || n != 1 {
			t.Fatalf("prune leases: %d %v", n, err)
		}
		if _, err := s.LeaseHolder(ctx, "live"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestProgressWriter: a burst of progress updates makes far fewer writes than updates; a
// new step (stage or message) is written at once; the last value is always written (by the
// timer, or by Flush).
func TestProgressWriter(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := storetestNew(t)
	js := s.Jobs()
	id, _ := js.Create(ctx, store.Job{Kind: "k", Target: "stack/s"})
	if _, err := js.Start(ctx, id, "r"); err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int32
	w := store.NewProgressWriter(100*time.Millisecond, func(ctx context.Context, p store.Progress) error {
		writes.Add(1)
		return js.Progress(ctx, id, p.Percent, p.Stage, p.Message)
	})
	defer w.Stop()
	get := func() store.Job {
		j, err := js.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}

	const events = 300
	start := time.Now()
	for i := range events {
		if err := w.Set(ctx, store.Progress{Percent: 40 + i*30/events, Stage: "Building", Message: "Building stack resources"}); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	// At most one write per interval, plus the first.
	if n, max := writes.Load(), int32(took/(100*time.Millisecond))+2; n > max || n >= events {
		t.Fatalf("%d writes for %d events in %v (at most %d)", n, events, took, max)
	}
	// The last value is written by the timer within the interval, without a Flush.
	deadline := time.Now().Add(10 * time.Second)
	for get().Percent != 40+(events-1)*30/events {
		if time.Now().After(deadline) {
			t.Fatalf("last progress never written: %+v", get())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A new stage is written at once.
	stageWritten := time.Now()
	if err := w.Set(ctx, store.Progress{Percent: 70, Stage: "Checking", Message: "agents"}); err != nil {
		t.Fatal(err)
	}
	if j := get(); j.Stage != "Checking" || j.Percent != 70 {
		t.Fatalf("stage change not written at once: %+v", j)
	}
	// A value kept back is written by Flush, and the final status after it.
	before := writes.Load()
	if err := w.Set(ctx, store.Progress{Percent: 80, Stage: "Checking", Message: "agents"}); err != nil {
		t.Fatal(err)
	}
	// (Only if the interval has not passed since the stage was written: on a loaded machine the
	// get above may take longer, and then writing at once is right.)
	if writes.Load() != before && time.Since(stageWritten) < 100*time.Millisecond {
		t.Fatal("a value within the interval was written at once")
	}
	w.Stop()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := js.Finish(ctx, id, errors.New("boom"), store.Doc{}); err != nil {
		t.Fatal(err)
	}
	if j := get(); j.Percent != 80 || j.Message != "agents" || j.Status != store.JobFailed {
		t.Fatalf("final: %+v", j)
	}
	// Flushing again writes nothing.
	n := writes.Load()
	if err := w.Flush(ctx); err != nil || writes.Load() != n {
		t.Fatalf("second flush: %v, writes %d → %d", err, n, writes.Load())
	}
}
