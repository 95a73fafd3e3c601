package kloud

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

// Retention: the store stays the size of what is live, not of everything kloud ever did.
//
// Every Retention.Interval (the first pass one minute after start, or sooner with a shorter
// interval) kloud prunes, through the store's Prune methods (kloud/store/prune.go: bounded
// batches, oldest first, each delete conditional, so a pass stopped midway loses nothing that
// should stay and the next pass finishes it):
//
//   - finished jobs (succeeded, failed, cancelled), with their logs and progress, Retention.Jobs
//     after they finished. Queued and running jobs never go. Nor does the newest job of a stack,
//     machine or credential that still exists: kloud shows its id (a stack's jobId, a
//     credential's bootstrap.jobId; a machine's newest job is how the reconciler judges it), so
//     `kloud job get` on it keeps working for as long as the thing exists;
//   - revocations an hour after the token they revoke expired (revocationMargin: well beyond
//     the verifiers' clock leeway); a kite key's revocation (it never expires) stays;
//   - presence records of kites not seen for Retention.Kites: each pass first refreshes the
//     records this replica holds (store.Kites.TouchReplica), so only the records of a replica
//     that died (or of this process before a restart) grow old;
//   - leases that expired an hour ago (takeable anyway; this only keeps the collection small);
//   - audit log entries Retention.Audit old (audit.go), the chain's checkpoint raised first.

// revocationMargin: a revocation is kept this long after its token expired, and a lease this
// long after it expired.
const revocationMargin = time.Hour

// Retention configures what kloud prunes from its store and when. Zero fields take the
// defaults.
type Retention struct {
	// Jobs is how long a finished job is kept after it finished. Default DefaultRetentionJobs
	// (30 days).
	Jobs time.Duration
	// Kites is how long a kite presence record is kept after its replica stopped refreshing it.
	// Default DefaultRetentionKites (24h); at least twice Interval (raised if less), since
	// every replica refreshes its records once per pass.
	Kites time.Duration
	// Audit is how long an audit log entry is kept (audit.go). Default DefaultRetentionAudit
	// (365 days). Pruning keeps the chain verifiable: it records the seq and hash the kept
	// entries start after (store.Audit.Prune), and never removes the newest entry.
	Audit time.Duration
	// Interval is how often kloud prunes. Default DefaultRetentionInterval (1h).
	Interval time.Duration
	// Batch is how many records one delete removes. Default store.DefaultPruneBatch.
	Batch int
}

func (r *Retention) defaults() {
	if r.Jobs <= 0 {
		r.Jobs = DefaultRetentionJobs
	}
	if r.Kites <= 0 {
		r.Kites = DefaultRetentionKites
	}
	if r.Audit <= 0 {
		r.Audit = DefaultRetentionAudit
	}
	if r.Interval <= 0 {
		r.Interval = DefaultRetentionInterval
	}
	if r.Kites < 2*r.Interval {
		r.Kites = 2 * r.Interval
	}
	if r.Batch <= 0 {
		r.Batch = store.DefaultPruneBatch
	}
}

// Pruned counts what one retention pass deleted.
type Pruned struct {
	Jobs, Revocations, Kites, Leases, Audit int64
	Attempts                                int64 // ended windows of failed logins (store.Attempts)
}

// jobTargets maps a job target's kind to the collection of the thing it changes, for
// keepLatestJob.
var jobTargets = map[string]string{
	"stack":      store.CollStacks,
	"machine":    store.CollMachines,
	"credential": store.CollCredentials,
}

// pruner runs the retention passes (a background task, routes.go) over the store and the
// audit log.
type pruner struct {
	store  *store.Store
	opts   Retention // Options.Retention, defaults applied
	audits *auditLog
	log    *slog.Logger
}

// keepLatestJob reports whether target still exists (then its newest job stays).
func (pr *pruner) keepLatestJob(ctx context.Context, target string) (bool, error) {
	kind, id, ok := strings.Cut(target, "/")
	coll := jobTargets[kind]
	if !ok || coll == "" {
		return false, nil
	}
	return pr.store.Exists(ctx, coll, id)
}

// prune is one retention pass. It goes on after an error in one kind (and returns them all
// joined), so one failing collection does not let the others grow.
func (pr *pruner) prune(ctx context.Context) (Pruned, error) {
	r := pr.opts
	now := pr.store.Now()
	o := store.PruneOptions{Batch: r.Batch}
	var p Pruned
	var errs []error
	var err error
	p.Jobs, err = pr.store.Jobs().Prune(ctx, store.JobPrune{PruneOptions: o, Before: now.Add(-r.Jobs), KeepLatest: pr.keepLatestJob})
	errs = append(errs, err)
	p.Revocations, err = pr.store.Revocations().Prune(ctx, now.Add(-revocationMargin), o)
	errs = append(errs, err)
	if _, err = pr.store.Kites().TouchReplica(ctx, pr.store.InstanceID(), now); err == nil {
		p.Kites, err = pr.store.Kites().Prune(ctx, now.Add(-r.Kites), o)
	}
	errs = append(errs, err)
	p.Leases, err = pr.store.PruneLeases(ctx, now.Add(-revocationMargin), o)
	errs = append(errs, err)
	p.Attempts, err = pr.store.Attempts().Prune(ctx, now, o) // ended windows of failed logins
	errs = append(errs, err)
	p.Audit, err = pr.audits.prune(ctx, now.Add(-r.Audit), o) // audit.go
	errs = append(errs, err)
	return p, errors.Join(errs...)
}

// run runs prune every Retention.Interval until ctx ends.
func (pr *pruner) run(ctx context.Context) {
	interval := pr.opts.Interval
	first := time.NewTimer(min(interval, time.Minute))
	defer first.Stop()
	select {
	case <-ctx.Done():
		return
	case <-first.C:
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		start := time.Now()
		// One replica's pass at a time (sweeps.go); the others skip their turn.
		var p Pruned
		err := (&sweeper{store: pr.store, log: pr.log}).run(ctx, "retention", func(ctx context.Context) (err error) {
			p, err = pr.prune(ctx)
			return err
		})
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errSweepBusy) {
			pr.log.DebugContext(ctx, "retention: skipped, another replica prunes", "err", err)
		} else if err != nil {
			pr.log.ErrorContext(ctx, "retention: prune", "err", err, "jobs", p.Jobs, "revocations", p.Revocations, "kites", p.Kites, "leases", p.Leases, "attempts", p.Attempts, "audit", p.Audit)
		} else if p != (Pruned{}) {
			pr.log.InfoContext(ctx, "retention: pruned", "jobs", p.Jobs, "revocations", p.Revocations, "kites", p.Kites, "leases", p.Leases, "attempts", p.Attempts, "audit", p.Audit, "took", time.Since(start))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
