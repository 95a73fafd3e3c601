package store_test

import (
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

// TestCommandObserverAndQuotaList: Options.OnCommand is told of each database command the
// driver finished, by name; Quotas.List returns every quota, by subject (kloud's quota metrics).
func TestCommandObserverAndQuotaList(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		var mu sync.Mutex
		seen := map[string]int{}
		s := b.open(t, store.Options{OnCommand: func(name string, d time.Duration, failed bool) {
			mu.Lock()
			defer mu.Unlock()
			if !failed && d >= 0 {
				seen[name]++
			}
		}})
		count := func(name string) int {
			mu.Lock()
			defer mu.Unlock()
			return seen[name]
		}
		if qs, err := s.Quotas().List(ctx); err != nil || len(qs) != 0 {
			t.Fatalf("no quotas: %v %v", qs, err)
		}
		finds := count("find")
		for _, q := range []store.Quota{{ID: "user/zed", Machines: 1}, {ID: "team/dev", Cores: 4}, {ID: "user/alice", MemoryMB: 8}} {
			if err := s.Quotas().Set(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		qs, err := s.Quotas().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, q := range qs {
			ids = append(ids, q.ID)
		}
		if len(ids) != 3 || ids[0] != "team/dev" || ids[1] != "user/alice" || ids[2] != "user/zed" || qs[0].Cores != 4 || qs[1].MemoryMB != 8 {
			t.Fatalf("list: %+v", qs)
		}
		if count("find") != finds+1 || count("update") < 3 {
			t.Fatalf("commands seen: %v (finds before the list: %d)", seen, finds)
		}
	})
}
