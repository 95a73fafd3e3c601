package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/store"
)

// TestRestartedInstanceTakesItsLeasesAtOnce: a store reopened on the same data directory (kloud
// restarted) is the same instance in a new process. The jobs and named leases its earlier
// process held are orphaned at once (Orphans, Start, AcquireLease, LeaseHolder), not after
// their TTL; another instance on the same database (a replica) still waits for the expiry.
func TestRestartedInstanceTakesItsLeasesAtOnce(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	dir := t.TempDir()
	open := func(opts store.Options) *store.Store {
		t.Helper()
		opts.DataDir, opts.Logger = dir, testutil.Logger(t)
		s, err := store.Open(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Leases far longer than the test: only the holder's death can free them.
	s1 := open(store.Options{JobLeaseTTL: time.Hour})
	old := s1.InstanceID()
	inst, _, ok := strings.Cut(old, ".")
	if !ok {
		t.Fatalf("instance id %q: want <instance>.<boot>", old)
	}
	if b, err := os.ReadFile(filepath.Join(dir, store.InstanceFile)); err != nil || strings.TrimSpace(string(b)) != inst {
		t.Fatalf("%s: %q %v, want %q", store.InstanceFile, b, err, inst)
	}
	js := s1.Jobs()
	mine, _ := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s1"})
	if _, err := js.Start(ctx, mine, old); err != nil {
		t.Fatal(err)
	}
	theirs, _ := js.Create(ctx, store.Job{Kind: "stack.apply", Target: "stack/s2"})
	if _, err := js.Start(ctx, theirs, "0123456789abcdef01234567.feedfeedfeedfeedfeedfeed"); err != nil {
		t.Fatal(err)
	}
	if _, err := s1.AcquireLease(ctx, "stack/s1", "stack.apply-1", time.Hour); err != nil {
		t.Fatal(err)
	}

	// A replica on the same database (the data directory is held: it gets an instance of its
	// own) waits for the lease, as before.
	s2 := open(store.Options{MongoURL: store.EmbeddedURI(s1), JobLeaseTTL: time.Hour})
	if strings.HasPrefix(s2.InstanceID(), inst+".") {
		t.Fatalf("second process on a held data dir got the same instance: %s, %s", s2.InstanceID(), old)
	}
	if _, err := s2.Jobs().Start(ctx, mine, s2.InstanceID()); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("another instance took a live job: %v", err)
	}
	if _, err := s2.AcquireLease(ctx, "stack/s1", "gc-2", time.Hour); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("another instance took a live lease: %v", err)
	}
	if o, err := s2.Jobs().Orphans(ctx, s2.Now()); err != nil || len(o) != 0 {
		t.Fatalf("orphans seen by another instance: %+v %v", o, err)
	}
	closeStore(t, s2)
	closeStore(t, s1) // the process "dies": its job and lease stay as they were

	s3 := open(store.Options{JobLeaseTTL: time.Hour})
	defer closeStore(t, s3)
	now := s3.InstanceID()
	if !strings.HasPrefix(now, inst+".") || now == old {
		t.Fatalf("restarted: %s, was %s: want the same instance, a new process", now, old)
	}
	o, err := s3.Jobs().Orphans(ctx, s3.Now())
	if err != nil || len(o) != 1 || o[0].ID != mine {
		t.Fatalf("orphans after a restart: %+v %v, want only %s (the other instance's job is live)", o, err, mine)
	}
	start := time.Now()
	j, err := s3.Jobs().Start(ctx, mine, now)
	if err != nil || j.Runner != now || j.Attempt != 2 {
		t.Fatalf("resume own job: %+v %v", j, err)
	}
	t.Logf("own job resumed %s after the restart", time.Since(start))
	if _, err := s3.Jobs().Start(ctx, theirs, now); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("took another instance's live job: %v", err)
	}
	if _, err := s3.LeaseHolder(ctx, "stack/s1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("lease of the dead process still held: %v", err)
	}
	l, err := s3.AcquireLease(ctx, "stack/s1", "stack.reset-3", time.Hour)
	if err != nil || l.Holder != now {
		t.Fatalf("take the dead process's lease: %+v %v", l, err)
	}
	// Now it is this process's: live, for itself and for the others.
	if h, err := s3.LeaseHolder(ctx, "stack/s1"); err != nil || h.Owner != "stack.reset-3" {
		t.Fatalf("holder: %+v %v", h, err)
	}
	if _, err := s3.AcquireLease(ctx, "stack/s1", "other", time.Hour); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("a live lease of this process was taken: %v", err)
	}
}
