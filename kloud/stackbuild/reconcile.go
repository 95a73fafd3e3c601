package stackbuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// No state without an exit.
//
// A stack is Building or Destroying, a machine Building, Starting, Stopping or Terminating,
// only while a job is changing it. Every job moves its target out of that state when it ends,
// with writes that have their own context and are retried (store.Store.Persist), and a last
// resort when the job function returns (ExitStack, kloud's machineAPI.runPower). What can still be left
// behind (kloud killed between two writes, a store down for longer than the retries, records
// of an older kloud) is found by the reconciler here: at startup, right after interrupted
// jobs were recovered, and then every DefaultReconcileInterval. It moves
//
//   - a stack in Building or Destroying to Failed, and
//   - a machine in Building, Starting, Stopping or Terminating to Unknown (machine.info then
//     asks the provider for the real state; Unknown allows destroy, and a stack whose machines
//     are Unknown can be built again),
//
// with a reason naming the job and the time, when no job is live for it and nobody holds its
// lease. "Live" uses the records the job runner itself uses: the target's lease (stack/ID or
// machine/ID, held from before the state change until after the final one) and the job
// (queued or running; a running job whose runner lease expired is recovery's business, unless
// it stayed unclaimed for staleJobAfter). The change itself is one conditional update: on the
// stack's state and job id (a new job always brings a new id in the same update that sets the
// state), on the machine's state and updatedAt.
//
// stack.apply reconciles a stack (and its machines) whose job is dead before building or
// destroying it, so both work from any state whose job is over. stack.reset lets a kloud
// administrator force a stack out of any state when no job is live, audited.

// staleJobAfter: a running job whose runner lease expired this long ago (or a queued job this
// much older than a job lease) and that nobody resumed counts as dead. Recovery claims such jobs
// within seconds, so this only matters when recovery itself cannot.
const staleJobAfter = 2 * time.Minute

var stackTransitional = []string{model.StackBuilding, model.StackDestroying}

func machineTransitional() []string {
	return []string{string(provider.Building), string(provider.Starting), string(provider.Stopping), string(provider.Terminating)}
}

// JobVerdict tells whether job id is over: dead is true if it is missing, finished, or stuck
// (see staleJobAfter); why says which, for a reason.
func (f *Flow) JobVerdict(ctx context.Context, id string) (dead bool, why string, err error) {
	if id == "" {
		return true, "no job recorded", nil
	}
	j, err := f.d.Store.Jobs().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return true, fmt.Sprintf("job %s no longer exists", id), nil
	}
	if err != nil {
		return false, "", err
	}
	return f.jobDoc(j)
}

func (f *Flow) jobDoc(j store.Job) (dead bool, why string, err error) {
	now := f.d.Store.Now()
	switch {
	case j.Status.Done():
		if j.Error != "" && j.Error != store.ErrJobCancelled.Error() {
			return true, fmt.Sprintf("job %s ended (%s: %s)", j.ID, j.Status, firstLine(j.Error)), nil
		}
		return true, fmt.Sprintf("job %s ended (%s)", j.ID, j.Status), nil
	case j.Status == store.JobRunning && j.LeaseUntil.Before(now.Add(-staleJobAfter)):
		return true, fmt.Sprintf("job %s stopped running at %s and was not resumed", j.ID, j.LeaseUntil.Format(time.RFC3339)), nil
	case j.Status == store.JobQueued && j.CreatedAt.Before(now.Add(-staleJobAfter-f.jobLease())):
		return true, fmt.Sprintf("job %s was never started", j.ID), nil
	}
	return false, fmt.Sprintf("job %s is %s", j.ID, j.Status), nil
}

func (f *Flow) jobLease() time.Duration {
	if f.d.JobLease > 0 {
		return f.d.JobLease
	}
	return 30 * time.Second
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// leaseLive reports whether someone other than own holds lease name.
func (f *Flow) leaseLive(ctx context.Context, name, own string) (bool, string, error) {
	l, err := f.d.Store.LeaseHolder(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return false, "", nil
	}
	if err != nil {
		return false, "", err
	}
	if own != "" && l.Owner == own {
		return false, "", nil
	}
	return true, fmt.Sprintf("lease %s is held by %s until %s", name, l.Owner, l.ExpiresAt.Format(time.RFC3339)), nil
}

// stackDead tells whether the stack's transitional state has no live job and no live lease
// (other than own, the caller's). A stack not in a transitional state is never "dead".
func (f *Flow) stackDead(ctx context.Context, st *model.Stack, own string) (dead bool, why string, err error) {
	if live, why, err := f.leaseLive(ctx, "stack/"+st.ID, own); err != nil || live {
		return false, why, err
	}
	return f.JobVerdict(ctx, st.JobID)
}

// reconcileStack moves st, if it is Building or Destroying with a dead job and a free lease,
// to Failed. It returns whether it did, and why not if the job is live.
func (f *Flow) reconcileStack(ctx context.Context, st *model.Stack, own string) (moved bool, why string, err error) {
	if st.State != model.StackBuilding && st.State != model.StackDestroying {
		return false, "", nil
	}
	dead, why, err := f.stackDead(ctx, st, own)
	if err != nil || !dead {
		return false, why, err
	}
	verb := "build"
	if st.State == model.StackDestroying {
		verb = "destroy"
	}
	now := f.d.Store.Now()
	reason := fmt.Sprintf("%s %s without finishing its bookkeeping; reconciled at %s", verb, why, now.Format(time.RFC3339))
	if st.JobID == "" {
		reason = fmt.Sprintf("%s with no job recorded (left by an earlier kloud); reconciled at %s", verb, now.Format(time.RFC3339))
	}
	ok, err := f.d.Store.Stacks().TransitionOfJob(ctx, st.ID, []string{st.State}, st.JobID,
		store.StackSet{State: new(model.StackFailed), Reason: new(reason)})
	if err != nil {
		return false, "", err
	}
	if ok {
		f.log.WarnContext(ctx, "reconciled a stuck stack", "stack", st.ID, "from", st.State, "to", model.StackFailed, "job", st.JobID, "reason", reason)
	}
	return ok, "", nil
}

// MachineDead tells whether machine m's transitional state has no live job and lease. Building
// and Terminating belong to its stack's job (lease stack/ID), Starting and Stopping to a
// machine job (lease machine/ID, the newest job with target machine/ID).
func (f *Flow) MachineDead(ctx context.Context, m *model.Machine, own string) (dead bool, why string, err error) {
	switch m.State {
	case provider.Building, provider.Terminating:
		if live, why, err := f.leaseLive(ctx, "stack/"+m.StackID, own); err != nil || live {
			return false, why, err
		}
		st, err := f.stack(ctx, m.StackID)
		if errors.Is(err, kite.ErrNotFound) {
			return true, "its stack no longer exists", nil
		}
		if err != nil {
			return false, "", err
		}
		dead, why, err := f.JobVerdict(ctx, st.JobID)
		if err != nil {
			return false, "", err
		}
		if st.State == model.StackBuilding || st.State == model.StackDestroying {
			return dead, "stack " + why, nil
		}
		// The stack left its transition, so the job that changed the machine is over.
		return true, fmt.Sprintf("stack is %s (%s)", st.State, why), nil
	case provider.Starting, provider.Stopping:
		if live, why, err := f.leaseLive(ctx, "machine/"+m.ID, own); err != nil || live {
			return false, why, err
		}
		js, err := f.d.Store.Jobs().List(ctx, store.JobFilter{Target: "machine/" + m.ID, Limit: 1})
		if err != nil {
			return false, "", err
		}
		if len(js) == 0 {
			return true, "no job recorded", nil
		}
		return f.jobDoc(js[0])
	}
	return false, "", nil
}

// reconcileMachine moves m, if it is in a transition whose job is dead, to Unknown.
func (f *Flow) reconcileMachine(ctx context.Context, m *model.Machine, own string) (moved bool, why string, err error) {
	if !m.State.InProgress() {
		return false, "", nil
	}
	dead, why, err := f.MachineDead(ctx, m, own)
	if err != nil || !dead {
		return false, why, err
	}
	now := f.d.Store.Now()
	reason := fmt.Sprintf("left %s (%s); reconciled at %s: machine.info asks the provider for its state", m.State, why, now.Format(time.RFC3339))
	ok, err := f.d.Store.Machines().TransitionUnchanged(ctx, m.ID, []string{string(m.State)}, m.UpdatedAt,
		store.MachineSet{State: new(string(provider.Unknown)), Reason: new(reason)})
	if err != nil {
		return false, "", err
	}
	if ok {
		f.log.WarnContext(ctx, "reconciled a stuck machine", "machine", m.ID, "stack", m.StackID, "from", m.State, "to", provider.Unknown, "reason", reason)
	}
	return ok, "", nil
}

// Reconcile is one pass of the reconciler over every stack and machine in a transition.
func (f *Flow) Reconcile(ctx context.Context) {
	sts, err := f.d.Store.Stacks().InStates(ctx, stackTransitional)
	if err != nil {
		if ctx.Err() == nil {
			f.log.ErrorContext(ctx, "reconcile: list stacks", "err", err)
		}
		return
	}
	for i := range sts {
		if _, _, err := f.reconcileStack(ctx, &sts[i], ""); err != nil && ctx.Err() == nil {
			f.log.ErrorContext(ctx, "reconcile stack", "stack", sts[i].ID, "err", err)
		}
	}
	ms, err := f.d.Store.Machines().InStates(ctx, machineTransitional())
	if err != nil {
		if ctx.Err() == nil {
			f.log.ErrorContext(ctx, "reconcile: list machines", "err", err)
		}
		return
	}
	for i := range ms {
		if _, _, err := f.reconcileMachine(ctx, &ms[i], ""); err != nil && ctx.Err() == nil {
			f.log.ErrorContext(ctx, "reconcile machine", "machine", ms[i].ID, "err", err)
		}
	}
}

// ReconcileForApply is stack.apply's first step, holding the stack's lease (own): a stack or
// machines left in a transition by a dead job are reconciled; a live job is an error that
// names it. It returns the stack as it is now.
func (f *Flow) ReconcileForApply(ctx context.Context, st *model.Stack, own string) (*model.Stack, error) {
	if st.State == model.StackBuilding || st.State == model.StackDestroying {
		moved, why, err := f.reconcileStack(ctx, st, own)
		if err != nil {
			return nil, err
		}
		if !moved && why != "" {
			return nil, fmt.Errorf("stack %s is %s: %s; wait for it or cancel it (kloud job cancel %s): %w", st.ID, st.State, why, st.JobID, kite.ErrState)
		}
	}
	ms, err := f.StackMachines(ctx, st.ID)
	if err != nil {
		return nil, err
	}
	for i := range ms {
		m := &ms[i]
		moved, why, err := f.reconcileMachine(ctx, m, own)
		if err != nil {
			return nil, err
		}
		if !moved && m.State.InProgress() {
			// A start or stop of one of its machines is under way: not now.
			return nil, fmt.Errorf("machine %s of stack %s is %s (%s); wait for it: %w", m.Label, st.ID, m.State, why, kite.ErrState)
		}
	}
	return f.stack(ctx, st.ID)
}

// Reset is stack.reset's work (the call checks that its caller is a kloud administrator, holds
// the stack's lease under own, and passes st as it is now that the lease is its): it forces st
// and its machines out of any state, to Failed (machines in a transition become Unknown) or, if
// nothing was ever built, to NotInitialized (every machine NotInitialized), only when no job is
// live for the stack or its machines; by (the administrator) and reason are recorded in the
// stack's resets and its reason.
func (f *Flow) Reset(ctx context.Context, st *model.Stack, own, by, to, reason string) error {
	if st.JobID != "" {
		dead, why, err := f.JobVerdict(ctx, st.JobID)
		if err != nil {
			return err
		}
		if !dead {
			return fmt.Errorf("stack %s: %s; cancel it first (kloud job cancel %s): %w", st.ID, why, st.JobID, kite.ErrState)
		}
	}
	ms, err := f.StackMachines(ctx, st.ID)
	if err != nil {
		return err
	}
	for i := range ms {
		if m := &ms[i]; m.State == provider.Starting || m.State == provider.Stopping {
			dead, why, err := f.MachineDead(ctx, m, own)
			if err != nil {
				return err
			}
			if !dead {
				return fmt.Errorf("machine %s is %s: %s; wait for it or cancel it: %w", m.Label, m.State, why, kite.ErrState)
			}
		}
	}
	if to == model.StackNotInitialized {
		built := st.TFJobID != ""
		for _, m := range ms {
			built = built || m.KiteID != ""
		}
		if built {
			return fmt.Errorf("stack %s was built (or a build got as far as its machines' keys); reset it to %s and destroy it: %w", st.ID, model.StackFailed, kite.ErrState)
		}
	}
	now := f.d.Store.Now()
	audit := model.StackReset{By: by, At: now, From: st.State, To: to, Job: st.JobID, Reason: reason}
	note := fmt.Sprintf("reset from %s to %s by %s at %s: %s", st.State, to, by, now.Format(time.RFC3339), reason)
	var matched bool
	err = f.d.Store.Persist(ctx, "reset stack "+st.ID, 0, func(ctx context.Context) error {
		var err error
		matched, err = f.d.Store.Stacks().Reset(ctx, st.ID, st.State, st.JobID, store.StackSet{State: new(to), Reason: new(note)}, audit)
		return err
	})
	if err != nil {
		return err
	}
	if !matched {
		return fmt.Errorf("stack %s changed meanwhile; look again and retry: %w", st.ID, kite.ErrConflict)
	}
	f.log.WarnContext(ctx, "stack reset by an administrator", "stack", st.ID, "owner", st.Owner, "by", by, "from", st.State, "to", to, "job", st.JobID, "reason", reason)
	for _, m := range ms {
		var next provider.State
		switch {
		case to == model.StackNotInitialized && m.State != provider.NotInitialized:
			next = provider.NotInitialized
		case to == model.StackFailed && m.State.InProgress():
			next = provider.Unknown
		default:
			continue
		}
		if f.SetMachine(ctx, m.ID, []provider.State{m.State}, store.MachineSet{State: new(string(next)), Reason: new(note)}) {
			f.log.WarnContext(ctx, "machine reset with its stack", slog.String("machine", m.ID), slog.String("from", string(m.State)), slog.String("to", string(next)))
		}
	}
	return nil
}
