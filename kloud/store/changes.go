package store

import (
	"context"

	"github.com/kloud-dev/kloud/kloud/model"
)

// Change is one write the store made to a machine, stack, job, snapshot or bucket claim, as
// [Options.OnChange] is told of it (kloud's event hub, kloud/events, turns it into events for
// the pages that show it). It names the documents; the reader re-reads them to see how they
// are now, except a job (Job: as written) and deleted documents (Gone: as they were, read just
// before the delete, since nothing is left to read after).
type Change struct {
	Coll    string // CollMachines, CollStacks, CollJobs, CollSnapshots or CollBuckets
	ID      string // the document's id; "" when KiteID or StackID names the documents
	KiteID  string // machines: the machine whose agent has this kite id (Machines.SetAgent)
	StackID string // machines: the machines of this stack (a delete of several)
	Field   string // what changed when it is one part: "agent", "shares", "idle" ("": anything)
	Deleted bool
	// Gone holds what a delete removed or what a share change replaced, as it was: a
	// []model.Machine (machines; the machine before its shares changed), a model.Stack, a
	// model.Snapshot or a model.BucketClaim. nil when nothing was read.
	Gone any
	Job  *Job // jobs: the job as written
}

// changed tells Options.OnChange of c (it must not block; see Options.OnChange).
func (s *Store) changed(c Change) {
	if s.opts.OnChange != nil {
		s.opts.OnChange(c)
	}
}

// watched reports whether someone is told of changes (deletes read what they remove only then).
func (s *Store) watched() bool { return s.opts.OnChange != nil }

// machinesBefore reads the machines a change is about to delete or replace, when someone is told
// of changes (nil otherwise, or when the read fails: the change is still told, without them).
func (r *Machines) machinesBefore(ctx context.Context, stackID string, ids ...string) []model.Machine {
	if !r.s.watched() {
		return nil
	}
	var out []model.Machine
	if len(ids) == 0 {
		ms, err := r.ByStack(ctx, stackID)
		if err != nil {
			return nil
		}
		return ms
	}
	for _, id := range ids {
		if m, err := r.Get(ctx, id); err == nil && (stackID == "" || m.StackID == stackID) {
			out = append(out, m)
		}
	}
	return out
}

// told tells of c if err is nil, and returns err.
func (s *Store) told(err error, c Change) error {
	if err == nil {
		s.changed(c)
	}
	return err
}

// toldIf returns a function that tells of c if the conditional write (ok, err) wrote, and
// returns (ok, err): r.s.toldIf(update(…))(Change{…}).
func (s *Store) toldIf(ok bool, err error) func(Change) (bool, error) {
	return func(c Change) (bool, error) {
		if ok && err == nil {
			s.changed(c)
		}
		return ok, err
	}
}
