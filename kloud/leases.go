package kloud

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

// Leases: one job (or one call that must not overlap a job) at a time per stack ("stack/ID")
// and per machine ("machine/ID"). A call takes the lease (takeLease) and hands its owner to the
// job it starts (the job's "lease" param), or releases it; the job renews it while it runs
// (keepLease) and, resumed after a restart, takes it again (retakeLease).

// stackLeaseTTL bounds how long a dead kloud keeps a stack (or machine) locked.
const stackLeaseTTL = time.Minute

// takeLease takes lease name ("stack/ID" or "machine/ID") for a new owner, kind-<new id>. busy
// starts the error when someone else holds it ("stack X is busy"); release gives the lease back
// (it lapses by itself if that fails) and is for a caller that started no job after all.
func (s *Server) takeLease(ctx context.Context, name, kind, busy string) (owner string, release func(), err error) {
	owner = kind + "-" + store.NewID()
	lease, err := s.store.AcquireLease(ctx, name, owner, stackLeaseTTL)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", busy, err)
	}
	return owner, func() {
		if err := s.store.Persist(ctx, "release lease "+name, 30*time.Second, lease.Release); err != nil {
			s.log.WarnContext(ctx, "release lease (it lapses by itself)", "lease", name, "err", err)
		}
	}, nil
}

// retakeLease takes lease name for owner again, waiting up to 15s while someone else holds it.
func (s *Server) retakeLease(ctx context.Context, name, owner string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := s.store.AcquireLease(ctx, name, owner, stackLeaseTTL)
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

// keepLease renews a stack or machine lease until ctx ends, then releases it.
func (s *Server) keepLease(ctx context.Context, name, owner string) (stop func()) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(stackLeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				rctx, rc := context.WithTimeout(context.Background(), 10*time.Second)
				if err := s.store.ReleaseLease(rctx, name, owner); err != nil && !errors.Is(err, store.ErrLeaseLost) {
					s.log.WarnContext(ctx, "release lease (it lapses by itself)", "lease", name, "err", err)
				}
				rc()
				return
			case <-t.C:
				if _, err := s.store.RenewLease(lctx, name, owner, stackLeaseTTL); err != nil && lctx.Err() == nil {
					s.log.WarnContext(ctx, "renew lease", "lease", name, "err", err)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}
