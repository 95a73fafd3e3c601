package store_test

import (
	"errors"
	"testing"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

func TestSnapshotsRepo(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		for _, sn := range []model.Snapshot{
			{ID: store.NewID(), Name: "a", Owner: "alice", MachineID: "m1", Status: model.SnapshotCreating, Attributes: map[string]any{"id": "sb-1"}},
			{ID: store.NewID(), Name: "b", Owner: "alice", MachineID: "m2", Status: model.SnapshotReady, Size: 100},
			{ID: store.NewID(), Name: "c", Owner: "bob", MachineID: "m3", Status: model.SnapshotReady, Size: 7},
		} {
			if err := s.Snapshots().Insert(ctx, sn); err != nil {
				t.Fatal(err)
			}
		}
		all, err := s.Snapshots().List(ctx, store.SnapshotFilter{Owner: "alice"})
		if err != nil || len(all) != 2 || all[0].Name != "a" || all[1].Name != "b" || all[0].Attributes["id"] != "sb-1" || all[0].CreatedAt.IsZero() {
			t.Fatalf("alice's: %+v %v", all, err)
		}
		if err := s.Snapshots().Insert(ctx, all[0]); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("duplicate: %v", err)
		}
		if l, err := s.Snapshots().List(ctx, store.SnapshotFilter{MachineID: "m3"}); err != nil || len(l) != 1 || l[0].Owner != "bob" {
			t.Fatalf("of m3: %+v %v", l, err)
		}
		if n, bytes, err := s.Snapshots().Usage(ctx, "alice"); err != nil || n != 2 || bytes != 100 {
			t.Fatalf("usage: %d %d %v", n, bytes, err)
		}
		a := all[0].ID
		size := int64(42)
		if ok, err := s.Snapshots().Set(ctx, a, []string{model.SnapshotReady}, store.SnapshotSet{Size: &size}); err != nil || ok {
			t.Fatalf("set from the wrong status: %v %v", ok, err)
		}
		if ok, err := s.Snapshots().Set(ctx, a, []string{model.SnapshotCreating}, store.SnapshotSet{Status: new(model.SnapshotReady), Size: &size}); err != nil || !ok {
			t.Fatalf("set: %v %v", ok, err)
		}
		if got, err := s.Snapshots().Get(ctx, a); err != nil || got.Status != model.SnapshotReady || got.Size != 42 || got.Name != "a" {
			t.Fatalf("after set: %+v %v", got, err)
		}
		if err := s.Snapshots().Delete(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := s.Snapshots().Delete(ctx, a); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("delete again: %v", err)
		}
		if _, err := s.Snapshots().Get(ctx, a); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("get deleted: %v", err)
		}
	})
}
