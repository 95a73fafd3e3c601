package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// No state without an exit.
//
// A stack is Building or Destroying, a machine Building, Starting, Stopping or Terminating,
// only while a job is changing it. Every job moves its target out of that state when it ends,
// with writes that have their own context and are retried (store.Store.Persist), and a last
// resort when the job function returns (exitStack, runMachinePower). What can still be left
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

// reconcileInterval is the reconciler's period (Options.ReconcileInterval).
func (s *Server) reconcileInterval() time.Duration { return s.opts.ReconcileInterval }

var stackTransitional = []string{StackBuilding, StackDestroying}

func machineTransitional() []string {
	return []string{string(provider.Building), string(provider.Starting), string(provider.Stopping), string(provider.Terminating)}
}

// jobVerdict tells whether job id is over: dead is true if it is missing, finished, or stuck
// (see staleJobAfter); why says which, for a reason.
func (s *Server) jobVerdict(ctx context.Context, id string) (dead bool, why string, err error) {
	if id == "" {
		return true, "no job recorded", nil
	}
	j, err := s.store.Jobs().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return true, fmt.Sprintf("job %s no longer exists", id), nil
	}
	if err != nil {
		return false, "", err
	}
	return s.jobDoc(j)
}

func (s *Server) jobDoc(j store.Job) (dead bool, why string, err error) {
	now := s.store.Now()
	switch {
	case j.Status.Done():
		if j.Error != "" && j.Error != store.ErrJobCancelled.Error() {
			return true, fmt.Sprintf("job %s ended (%s: %s)", j.ID, j.Status, firstLine(j.Error)), nil
		}
		return true, fmt.Sprintf("job %s ended (%s)", j.ID, j.Status), nil
	case j.Status == store.JobRunning && j.LeaseUntil.Before(now.Add(-staleJobAfter)):
		return true, fmt.Sprintf("job %s stopped running at %s and was not resumed", j.ID, j.LeaseUntil.Format(time.RFC3339)), nil
	case j.Status == store.JobQueued && j.CreatedAt.Before(now.Add(-staleJobAfter-s.jobLease())):
		return true, fmt.Sprintf("job %s was never started", j.ID), nil
	}
	return false, fmt.Sprintf("job %s is %s", j.ID, j.Status), nil
}

func (s *Server) jobLease() time.Duration {
	if s.opts.JobLease > 0 {
		return s.opts.JobLease
	}
	return 30 * time.Second
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// leaseLive reports whether someone other than own holds lease name.
func (s *Server) leaseLive(ctx context.Context, name, own string) (bool, string, error) {
	l, err := s.store.LeaseHolder(ctx, name)
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
func (s *Server) stackDead(ctx context.Context, st *Stack, own string) (dead bool, why string, err error) {
	if live, why, err := s.leaseLive(ctx, "stack/"+st.ID, own); err != nil || live {
		return false, why, err
	}
	return s.jobVerdict(ctx, st.JobID)
}

// reconcileStack moves st, if it is Building or Destroying with a dead job and a free lease,
// to Failed. It returns whether it did, and why not if the job is live.
func (s *Server) reconcileStack(ctx context.Context, st *Stack, own string) (moved bool, why string, err error) {
	if st.State != StackBuilding && st.State != StackDestroying {
		return false, "", nil
	}
	dead, why, err := s.stackDead(ctx, st, own)
	if err != nil || !dead {
		return false, why, err
	}
	verb := "build"
	if st.State == StackDestroying {
		verb = "destroy"
	}
	now := s.store.Now()
	reason := fmt.Sprintf("%s %s without finishing its bookkeeping; reconciled at %s", verb, why, now.Format(time.RFC3339))
	if st.JobID == "" {
		reason = fmt.Sprintf("%s with no job recorded (left by an earlier kloud); reconciled at %s", verb, now.Format(time.RFC3339))
	}
	ok, err := s.store.Stacks().TransitionOfJob(ctx, st.ID, []string{st.State}, st.JobID,
		store.StackSet{State: new(StackFailed), Reason: new(reason)})
	if err != nil {
		return false, "", err
	}
	if ok {
		s.log.WarnContext(ctx, "reconciled a stuck stack", "stack", st.ID, "from", st.State, "to", StackFailed, "job", st.JobID, "reason", reason)
	}
	return ok, "", nil
}

// machineDead tells whether machine m's transitional state has no live job and lease. Building
// and Terminating belong to its stack's job (lease stack/ID), Starting and Stopping to a
// machine job (lease machine/ID, the newest job with target machine/ID).
func (s *Server) machineDead(ctx context.Context, m *Machine, own string) (dead bool, why string, err error) {
	switch m.State {
	case provider.Building, provider.Terminating:
		if live, why, err := s.leaseLive(ctx, "stack/"+m.StackID, own); err != nil || live {
			return false, why, err
		}
		st, err := s.loadStack(ctx, nil, m.StackID)
		if errors.Is(err, kite.ErrNotFound) {
			return true, "its stack no longer exists", nil
		}
		if err != nil {
			return false, "", err
		}
		dead, why, err := s.jobVerdict(ctx, st.JobID)
		if err != nil {
			return false, "", err
		}
		if st.State == StackBuilding || st.State == StackDestroying {
			return dead, "stack " + why, nil
		}
		// The stack left its transition, so the job that changed the machine is over.
		return true, fmt.Sprintf("stack is %s (%s)", st.State, why), nil
	case provider.Starting, provider.Stopping:
		if live, why, err := s.leaseLive(ctx, "machine/"+m.ID, own); err != nil || live {
			return false, why, err
		}
		js, err := s.store.Jobs().List(ctx, store.JobFilter{Target: "machine/" + m.ID, Limit: 1})
		if err != nil {
			return false, "", err
		}
		if len(js) == 0 {
			return true, "no job recorded", nil
		}
		return s.jobDoc(js[0])
	}
	return false, "", nil
}

// reconcileMachine moves m, if it is in a transition whose job is dead, to Unknown.
func (s *Server) reconcileMachine(ctx context.Context, m *Machine, own string) (moved bool, why string, err error) {
	if !m.State.InProgress() {
		return false, "", nil
	}
	dead, why, err := s.machineDead(ctx, m, own)
	if err != nil || !dead {
		return false, why, err
	}
	now := s.store.Now()
	reason := fmt.Sprintf("left %s (%s); reconciled at %s: machine.info asks the provider for its state", m.State, why, now.Format(time.RFC3339))
	ok, err := s.store.Machines().TransitionUnchanged(ctx, m.ID, []string{string(m.State)}, m.UpdatedAt,
		store.MachineSet{State: new(string(provider.Unknown)), Reason: new(reason)})
	if err != nil {
		return false, "", err
	}
	if ok {
		s.log.WarnContext(ctx, "reconciled a stuck machine", "machine", m.ID, "stack", m.StackID, "from", m.State, "to", provider.Unknown, "reason", reason)
	}
	return ok, "", nil
}

// reconcile is one pass of the reconciler over every stack and machine in a transition.
func (s *Server) reconcile(ctx context.Context) {
	sts, err := s.store.Stacks().InStates(ctx, stackTransitional)
	if err != nil {
		if ctx.Err() == nil {
			s.log.ErrorContext(ctx, "reconcile: list stacks", "err", err)
		}
		return
	}
	for i := range sts {
		if _, _, err := s.reconcileStack(ctx, &sts[i], ""); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "reconcile stack", "stack", sts[i].ID, "err", err)
		}
	}
	ms, err := s.store.Machines().InStates(ctx, machineTransitional())
	if err != nil {
		if ctx.Err() == nil {
			s.log.ErrorContext(ctx, "reconcile: list machines", "err", err)
		}
		return
	}
	for i := range ms {
		if _, _, err := s.reconcileMachine(ctx, &ms[i], ""); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "reconcile machine", "machine", ms[i].ID, "err", err)
		}
	}
}

// reconcileForApply is stack.apply's first step, holding the stack's lease (own): a stack or
// machines left in a transition by a dead job are reconciled; a live job is an error that
// names it. It returns the stack as it is now.
func (s *Server) reconcileForApply(ctx context.Context, st *Stack, own string) (*Stack, error) {
	if st.State == StackBuilding || st.State == StackDestroying {
		moved, why, err := s.reconcileStack(ctx, st, own)
		if err != nil {
			return nil, err
		}
		if !moved && why != "" {
			return nil, fmt.Errorf("stack %s is %s: %s; wait for it or cancel it (kloud job cancel %s): %w", st.ID, st.State, why, st.JobID, kite.ErrState)
		}
	}
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return nil, err
	}
	for i := range ms {
		m := &ms[i]
		moved, why, err := s.reconcileMachine(ctx, m, own)
		if err != nil {
			return nil, err
		}
		if !moved && m.State.InProgress() {
			// A start or stop of one of its machines is under way: not now.
			return nil, fmt.Errorf("machine %s of stack %s is %s (%s); wait for it: %w", m.Label, st.ID, m.State, why, kite.ErrState)
		}
	}
	return s.loadStack(ctx, nil, st.ID)
}

// Reset: an administrator's way out of any state.

// stackReset forces a stack and its machines out of any state: to Failed (machines in a
// transition become Unknown) or, if nothing was ever built, to NotInitialized (every machine
// NotInitialized). Only kloud administrators, only when no job is live for the stack or its
// machines (it holds the stack's lease meanwhile, so none starts).
func (s *Server) stackReset(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackResetParams) (any, error) {
	if !c.Admin {
		return nil, fmt.Errorf("stack.reset is for kloud administrators: %w", kite.ErrPermission)
	}
	st, err := s.loadStack(ctx, nil, p.StackID)
	if err != nil {
		return nil, err
	}
	owner, release, err := s.takeLease(ctx, "stack/"+st.ID, "reset", "stack "+st.ID+" is busy (a job holds it; cancel it first)")
	if err != nil {
		return nil, err
	}
	defer release()
	if st, err = s.loadStack(ctx, nil, st.ID); err != nil { // as it is now that it is ours
		return nil, err
	}
	if st.JobID != "" {
		dead, why, err := s.jobVerdict(ctx, st.JobID)
		if err != nil {
			return nil, err
		}
		if !dead {
			return nil, fmt.Errorf("stack %s: %s; cancel it first (kloud job cancel %s): %w", st.ID, why, st.JobID, kite.ErrState)
		}
	}
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return nil, err
	}
	for i := range ms {
		if m := &ms[i]; m.State == provider.Starting || m.State == provider.Stopping {
			dead, why, err := s.machineDead(ctx, m, owner)
			if err != nil {
				return nil, err
			}
			if !dead {
				return nil, fmt.Errorf("machine %s is %s: %s; wait for it or cancel it: %w", m.Label, m.State, why, kite.ErrState)
			}
		}
	}
	if p.State == StackNotInitialized {
		built := st.TFJobID != ""
		for _, m := range ms {
			built = built || m.KiteID != ""
		}
		if built {
			return nil, fmt.Errorf("stack %s was built (or a build got as far as its machines' keys); reset it to %s and destroy it: %w", st.ID, StackFailed, kite.ErrState)
		}
	}
	now := s.store.Now()
	audit := StackReset{By: c.Username, At: now, From: st.State, To: p.State, Job: st.JobID, Reason: p.Reason}
	reason := fmt.Sprintf("reset from %s to %s by %s at %s: %s", st.State, p.State, c.Username, now.Format(time.RFC3339), p.Reason)
	var matched bool
	err = s.store.Persist(ctx, "reset stack "+st.ID, 0, func(ctx context.Context) error {
		var err error
		matched, err = s.store.Stacks().Reset(ctx, st.ID, st.State, st.JobID, store.StackSet{State: new(p.State), Reason: new(reason)}, audit)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !matched {
		return nil, fmt.Errorf("stack %s changed meanwhile; look again and retry: %w", st.ID, kite.ErrConflict)
	}
	s.log.WarnContext(ctx, "stack reset by an administrator", "stack", st.ID, "owner", st.Owner, "by", c.Username, "from", st.State, "to", p.State, "job", st.JobID, "reason", p.Reason)
	for _, m := range ms {
		var to provider.State
		switch {
		case p.State == StackNotInitialized && m.State != provider.NotInitialized:
			to = provider.NotInitialized
		case p.State == StackFailed && m.State.InProgress():
			to = provider.Unknown
		default:
			continue
		}
		if s.setMachine(ctx, m.ID, []provider.State{m.State}, store.MachineSet{State: new(string(to)), Reason: new(reason)}) {
			s.log.WarnContext(ctx, "machine reset with its stack", slog.String("machine", m.ID), slog.String("from", string(m.State)), slog.String("to", string(to)))
		}
	}
	return s.stackDescribe(ctx, c, nil, &api.StackRef{StackID: st.ID})
}
