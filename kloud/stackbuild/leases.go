package stackbuild

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

// Leases: one job (or one call that must not overlap a job) at a time per stack ("stack/ID")
// and per machine ("machine/ID"). A call takes the lease (TakeLease) and hands its owner to the
// job it starts (the job's "lease" param), or releases it; the job renews it while it runs
// (KeepLease) and, resumed after a restart, takes it again (RetakeLease).

// LeaseTTL bounds how long a dead kloud keeps a stack (or machine) locked.
const LeaseTTL = time.Minute

// TakeLease takes lease name ("stack/ID" or "machine/ID") for a new owner, kind-<new id>. busy
// starts the error when someone else holds it ("stack X is busy"); release gives the lease back
// (it lapses by itself if that fails) and is for a caller that started no job after all.
func (f *Flow) TakeLease(ctx context.Context, name, kind, busy string) (owner string, release func(), err error) {
	owner = kind + "-" + store.NewID()
	lease, err := f.d.Store.AcquireLease(ctx, name, owner, LeaseTTL)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", busy, err)
	}
	return owner, func() {
		if err := f.d.Store.Persist(ctx, "release lease "+name, 30*time.Second, lease.Release); err != nil {
			f.log.WarnContext(ctx, "release lease (it lapses by itself)", "lease", name, "err", err)
		}
	}, nil
}

// RetakeLease takes lease name for owner again, waiting up to 15s while someone else holds it.
func (f *Flow) RetakeLease(ctx context.Context, name, owner string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := f.d.Store.AcquireLease(ctx, name, owner, LeaseTTL)
		if err == nil || !errors.Is(err, store.ErrLocked) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// KeepLease renews a stack or machine lease until ctx ends, then releases it.
func (f *Flow) KeepLease(ctx context.Context, name, owner string) (stop func()) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				rctx, rc := context.WithTimeout(context.Background(), 10*time.Second)
				if err := f.d.Store.ReleaseLease(rctx, name, owner); err != nil && !errors.Is(err, store.ErrLeaseLost) {
					f.log.WarnContext(ctx, "release lease (it lapses by itself)", "lease", name, "err", err)
				}
				rc()
				return
			case <-t.C:
				if _, err := f.d.Store.RenewLease(lctx, name, owner, LeaseTTL); err != nil && lctx.Err() == nil {
					f.log.WarnContext(ctx, "renew lease", "lease", name, "err", err)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}
