package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Sweeps across replicas (issue 24): the periodic passes over the whole store (the reconciler,
// the retention prune, the garbage collector's sweep) run on every replica's timer, but one at
// a time across all of them: each pass holds the store lease "sweep/<name>" (sweepLease), which a
// replica whose sweep is under way elsewhere does not get, so it skips its turn. The lease is
// renewed while the pass runs and released at its end; a replica that dies mid-pass leaves it
// for at most sweepLeaseTTL. The per-stack and per-machine leases (stackbuild's leases.go) still
// guard what each pass changes, so two passes would be safe, only wasteful and noisy (two gc
// sweeps listing every provider's resources, two reconcilers logging the same repair).

// sweepLeaseTTL bounds how long a dead replica's pass keeps the others from sweeping.
const sweepLeaseTTL = time.Minute

// sweeper runs named passes under their sweep leases.
type sweeper struct {
	store *store.Store
	log   *slog.Logger
	ttl   time.Duration // 0: sweepLeaseTTL
}

// errSweepBusy: the pass runs on another replica (or in another call here) now.
var errSweepBusy = fmt.Errorf("runs elsewhere now: %w", kite.ErrConflict)

// run runs fn holding the lease "sweep/<name>"; if another holds it, it returns an error wrapping
// errSweepBusy at once and fn does not run. fn's context ends if the lease is lost (a stall
// longer than the TTL, and another replica took it over).
func (w *sweeper) run(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	ttl := w.ttl
	if ttl <= 0 {
		ttl = sweepLeaseTTL
	}
	lease, err := w.store.AcquireLease(ctx, "sweep/"+name, "sweep-"+store.NewID(), ttl)
	if errors.Is(err, store.ErrLocked) {
		return fmt.Errorf("%s: %w (%w)", name, errSweepBusy, err)
	}
	if err != nil {
		return fmt.Errorf("%s: sweep lease: %w", name, err)
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-fctx.Done():
				return
			case <-t.C:
				if err := lease.Renew(fctx, ttl); errors.Is(err, store.ErrLeaseLost) {
					w.log.WarnContext(ctx, "sweep lease lost; stopping the pass here", "sweep", name, "err", err)
					cancel()
					return
				} else if err != nil && fctx.Err() == nil {
					w.log.WarnContext(ctx, "renew sweep lease", "sweep", name, "err", err)
				}
			}
		}
	}()
	ferr := fn(fctx)
	cancel()
	<-done
	if err := w.store.Persist(context.WithoutCancel(ctx), "release lease sweep/"+name, 10*time.Second, lease.Release); err != nil && !errors.Is(err, store.ErrLeaseLost) {
		w.log.WarnContext(ctx, "release sweep lease (it lapses by itself)", "sweep", name, "err", err)
	}
	return ferr
}

// sweeps is the sweeper over s's store (it holds no state of its own).
func (s *Server) sweeps() *sweeper { return &sweeper{store: s.store, log: s.log} }

// periodic is run for a background pass: a busy lease is this turn skipped, quietly.
func (w *sweeper) periodic(ctx context.Context, name string, fn func(ctx context.Context) error) {
	err := w.run(ctx, name, fn)
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.Is(err, errSweepBusy):
		w.log.DebugContext(ctx, "sweep skipped: another replica runs it", "sweep", name)
	default:
		w.log.WarnContext(ctx, "sweep", "sweep", name, "err", err)
	}
}
