package store_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

// TestReplicas: a beat keeps a replica's record live (startedAt from the first beat only); a
// record past its expiry is listed as expired and removed only while it still is; removing a
// dead replica's presence records leaves the kites that moved to another replica.
func TestReplicas(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})
		reps := s.Replicas()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(reps.Beat(ctx, store.ReplicaRecord{ID: "r1", InternalURL: "http://10.0.0.1:7000"}, 15*time.Second))
		started := clk.Now()
		clk.Advance(10 * time.Second)
		must(reps.Beat(ctx, store.ReplicaRecord{ID: "r1", InternalURL: "http://10.0.0.1:7000"}, 15*time.Second))
		must(reps.Beat(ctx, store.ReplicaRecord{ID: "r2", InternalURL: "http://10.0.0.2:7000"}, 15*time.Second))
		r, err := reps.Get(ctx, "r1")
		must(err)
		if !r.StartedAt.Equal(started) || !r.LastSeen.Equal(clk.Now()) || !r.ExpiresAt.Equal(clk.Now().Add(15*time.Second)) || r.InternalURL != "http://10.0.0.1:7000" {
			t.Fatalf("record after two beats: %+v", r)
		}
		if _, err := reps.Get(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("missing replica: %v", err)
		}

		// r2 stops beating; r1 goes on.
		must(s.Kites().Upsert(ctx, store.KiteRecord{ID: "agent.a", Replica: "r2"}))
		must(s.Kites().Upsert(ctx, store.KiteRecord{ID: "agent.b", Replica: "r2"}))
		must(s.Kites().Upsert(ctx, store.KiteRecord{ID: "agent.c", Replica: "r1"}))
		clk.Advance(10 * time.Second)
		must(reps.Beat(ctx, store.ReplicaRecord{ID: "r1"}, 15*time.Second))
		clk.Advance(10 * time.Second)
		dead, err := reps.Expired(ctx, clk.Now())
		must(err)
		if len(dead) != 1 || dead[0].ID != "r2" {
			t.Fatalf("expired: %+v", dead)
		}
		if ok, err := reps.Remove(ctx, "r1", clk.Now()); err != nil || ok {
			t.Fatalf("removing a live replica: %v %v", ok, err)
		}
		// agent.b reconnected to r1 before the sweep: its record is r1's now.
		must(s.Kites().Upsert(ctx, store.KiteRecord{ID: "agent.b", Replica: "r1"}))
		gone, err := s.Kites().RemoveReplica(ctx, "r2")
		must(err)
		if !slices.Equal(gone, []string{"agent.a"}) {
			t.Fatalf("removed presence records: %v", gone)
		}
		if ok, err := reps.Remove(ctx, "r2", clk.Now()); err != nil || !ok {
			t.Fatalf("removing the dead replica: %v %v", ok, err)
		}
		all, err := reps.List(ctx)
		must(err)
		if len(all) != 1 || all[0].ID != "r1" {
			t.Fatalf("replicas left: %+v", all)
		}
		must(reps.Leave(ctx, "r1"))
		if all, _ := reps.List(ctx); len(all) != 0 {
			t.Fatalf("after leave: %+v", all)
		}
	})
}
