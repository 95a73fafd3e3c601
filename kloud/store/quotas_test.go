package store_test

import (
	"errors"
	"testing"

	"github.com/kloud-dev/kloud/kloud/store"
)

// TestQuotas: no quota is not found; Set creates and then replaces a subject's quota whole.
func TestQuotas(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		if _, err := s.Quotas().Get(ctx, "user/alice"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("no quota: %v", err)
		}
		if err := s.Quotas().Set(ctx, store.Quota{ID: "user/alice", Machines: 3, Cores: 2.5, MemoryMB: 8192, DiskMB: 51200, UpdatedBy: "admin"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Quotas().Set(ctx, store.Quota{ID: "team/dev", Machines: 10}); err != nil {
			t.Fatal(err)
		}
		if err := s.Quotas().Set(ctx, store.Quota{ID: "user/alice", Machines: 5, UpdatedBy: "admin"}); err != nil {
			t.Fatal(err)
		}
		q, err := s.Quotas().Get(ctx, "user/alice")
		if err != nil || q.Machines != 5 || q.Cores != 0 || q.MemoryMB != 0 || q.DiskMB != 0 || q.UpdatedBy != "admin" || q.UpdatedAt.IsZero() {
			t.Fatalf("replaced quota: %+v, %v", q, err)
		}
		if q, err := s.Quotas().Get(ctx, "team/dev"); err != nil || q.Machines != 10 {
			t.Fatalf("team quota: %+v, %v", q, err)
		}
	})
}
