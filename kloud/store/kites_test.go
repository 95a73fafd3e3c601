package store_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

func TestKites(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})
		kites := s.Kites()
		recs := []store.KiteRecord{
			{ID: "k1", Username: "alice", Environment: "prod", Name: "klient", Version: "1.0", Region: "eu", Hostname: "m1", URL: "ws://10.200.0.2:56789/kite", Replica: "r1"},
			{ID: "k2", Username: "alice", Environment: "prod", Name: "klient", Version: "1.1", Region: "us", Hostname: "m2", Replica: "r1"},
			{ID: "k3", Username: "bob", Environment: "prod", Name: "klient", Version: "1.0", Region: "eu", Hostname: "m3", Replica: "r2"},
			{ID: "k4", Username: "alice", Environment: "dev", Name: "terraformer", Version: "1.0", Region: "eu", Hostname: "h", Replica: "r2"},
		}
		for _, r := range recs {
			if err := kites.Upsert(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		ids := func(rs []store.KiteRecord) []string {
			var out []string
			for _, r := range rs {
				out = append(out, r.ID)
			}
			return out
		}
		for _, c := range []struct {
			filter map[string]string
			want   []string
		}{
			{nil, []string{"k1", "k2", "k3", "k4"}},
			{map[string]string{"username": "alice"}, []string{"k1", "k2", "k4"}},
			{map[string]string{"username": "alice", "name": "klient"}, []string{"k1", "k2"}},
			{map[string]string{"username": "alice", "name": "klient", "region": "eu"}, []string{"k1"}},
			{map[string]string{"environment": "prod", "version": "1.0"}, []string{"k1", "k3"}},
			{map[string]string{"hostname": "m3"}, []string{"k3"}},
			{map[string]string{"id": "k4"}, []string{"k4"}},
			{map[string]string{"id": "k4", "username": "bob"}, nil},
			{map[string]string{"username": "alice", "region": ""}, []string{"k1", "k2", "k4"}},
			{map[string]string{"username": "carol"}, nil},
		} {
			got, err := kites.Find(ctx, c.filter)
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(got); len(g) != len(c.want) || !slices.Equal(g, c.want) {
				t.Errorf("find %v: %v, want %v", c.filter, g, c.want)
			}
		}
		if _, err := kites.Find(ctx, map[string]string{"url": "x"}); err == nil {
			t.Error("find by a non-identity field succeeded")
		}

		k1, err := kites.Get(ctx, "k1")
		if err != nil || k1.URL != recs[0].URL || !k1.ConnectedAt.Equal(clk.Now()) || !k1.LastSeen.Equal(clk.Now()) {
			t.Fatalf("get: %+v %v", k1, err)
		}
		clk.Advance(time.Minute)
		if err := kites.Touch(ctx, "k1", clk.Now()); err != nil {
			t.Fatal(err)
		}
		if k, _ := kites.Get(ctx, "k1"); !k.LastSeen.Equal(clk.Now()) || k.ConnectedAt.Equal(clk.Now()) {
			t.Fatalf("after touch: %+v", k)
		}
		if err := kites.Touch(ctx, "nope", clk.Now()); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("touch missing: %v", err)
		}

		// k1 reconnects to replica r2; r1's late cleanup must not remove it.
		moved := recs[0]
		moved.Replica = "r2"
		if err := kites.Upsert(ctx, moved); err != nil {
			t.Fatal(err)
		}
		if ok, err := kites.Remove(ctx, "k1", "r1"); err != nil || ok {
			t.Fatalf("remove by the old replica: %v %v", ok, err)
		}
		if rs, _ := kites.ByReplica(ctx, "r2"); !slices.Equal(ids(rs), []string{"k1", "k3", "k4"}) {
			t.Fatalf("by replica r2: %v", ids(rs))
		}
		if ok, err := kites.Remove(ctx, "k1", "r2"); err != nil || !ok {
			t.Fatalf("remove by the owner: %v %v", ok, err)
		}
		if _, err := kites.Get(ctx, "k1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("get removed: %v", err)
		}
		// Records not seen for a while go.
		if err := kites.Touch(ctx, "k2", clk.Now()); err != nil {
			t.Fatal(err)
		}
		if n, err := kites.Prune(ctx, clk.Now().Add(-time.Second), store.PruneOptions{}); err != nil || n != 2 {
			t.Fatalf("prune: %d %v", n, err)
		}
		if rs, _ := kites.Find(ctx, nil); !slices.Equal(ids(rs), []string{"k2"}) {
			t.Fatalf("after prune: %v", ids(rs))
		}
	})
}

// TestKitesWrite: one Write upserts whole records (a new one, one moving to this replica) and
// removes only the records this replica still owns, in one command; an empty batch writes
// nothing, and a record without an id fails the batch.
func TestKitesWrite(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		clk := newClock()
		s := b.open(t, store.Options{Now: clk.Now})
		kites := s.Kites()
		for _, r := range []store.KiteRecord{{ID: "gone", Replica: "r1"}, {ID: "moved", Replica: "r2"}, {ID: "other", Replica: "r2"}} {
			if err := kites.Upsert(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := kites.Write(ctx, nil, nil, "r1"); err != nil {
			t.Fatal(err)
		}
		at := clk.Now().Add(-time.Hour)
		ups := []store.KiteRecord{
			{ID: "new", Username: "alice", Name: "klient", Replica: "r1", ConnectedAt: at},
			{ID: "moved", Username: "bob", Name: "klient", Replica: "r1"},
		}
		if err := kites.Write(ctx, ups, []string{"gone", "other", "absent"}, "r1"); err != nil {
			t.Fatal(err)
		}
		all, err := kites.Find(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]store.KiteRecord{}
		for _, r := range all {
			got[r.ID] = r
		}
		if len(got) != 3 || got["new"].Username != "alice" || !got["new"].ConnectedAt.Equal(at) || !got["new"].LastSeen.Equal(clk.Now()) ||
			got["moved"].Replica != "r1" || got["moved"].Username != "bob" || got["other"].Replica != "r2" {
			t.Fatalf("after the write (want new and moved on r1, other kept on r2, gone removed): %+v", all)
		}
		if err := kites.Write(ctx, []store.KiteRecord{{Replica: "r1"}}, nil, "r1"); err == nil {
			t.Fatal("a record without an id was written")
		}
	})
}
