package kloud

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// reconcileInterval is the reconciler's period (Options.ReconcileInterval); the reconciler
// itself is kloud/stackbuild's (reconcile.go there).
func (s *Server) reconcileInterval() time.Duration { return s.opts.ReconcileInterval }

// reconcile is one pass of the reconciler over every stack and machine in a transition.
func (s *Server) reconcile(ctx context.Context) { s.flow().Reconcile(ctx) }

// stackTransitional are the states of a stack that a job is changing.
var stackTransitional = []string{StackBuilding, StackDestroying}

// Reset: an administrator's way out of any state.

// stackReset forces a stack and its machines out of any state: to Failed (machines in a
// transition become Unknown) or, if nothing was ever built, to NotInitialized (every machine
// NotInitialized). Only kloud administrators, only when no job is live for the stack or its
// machines (it holds the stack's lease meanwhile, so none starts).
func (s *Server) stackReset(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackResetParams) (api.StackView, error) {
	if !c.Admin {
		return api.StackView{}, fmt.Errorf("stack.reset is for kloud administrators: %w", kite.ErrPermission)
	}
	st, err := s.loadStack(ctx, nil, p.StackID)
	if err != nil {
		return api.StackView{}, err
	}
	owner, release, err := s.takeLease(ctx, "stack/"+st.ID, "reset", "stack "+st.ID+" is busy (a job holds it; cancel it first)")
	if err != nil {
		return api.StackView{}, err
	}
	defer release()
	if st, err = s.loadStack(ctx, nil, st.ID); err != nil { // as it is now that it is ours
		return api.StackView{}, err
	}
	if st.JobID != "" {
		dead, why, err := s.flow().JobVerdict(ctx, st.JobID)
		if err != nil {
			return api.StackView{}, err
		}
		if !dead {
			return api.StackView{}, fmt.Errorf("stack %s: %s; cancel it first (kloud job cancel %s): %w", st.ID, why, st.JobID, kite.ErrState)
		}
	}
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return api.StackView{}, err
	}
	for i := range ms {
		if m := &ms[i]; m.State == provider.Starting || m.State == provider.Stopping {
			dead, why, err := s.flow().MachineDead(ctx, m, owner)
			if err != nil {
				return api.StackView{}, err
			}
			if !dead {
				return api.StackView{}, fmt.Errorf("machine %s is %s: %s; wait for it or cancel it: %w", m.Label, m.State, why, kite.ErrState)
			}
		}
	}
	if p.State == StackNotInitialized {
		built := st.TFJobID != ""
		for _, m := range ms {
			built = built || m.KiteID != ""
		}
		if built {
			return api.StackView{}, fmt.Errorf("stack %s was built (or a build got as far as its machines' keys); reset it to %s and destroy it: %w", st.ID, StackFailed, kite.ErrState)
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
		return api.StackView{}, err
	}
	if !matched {
		return api.StackView{}, fmt.Errorf("stack %s changed meanwhile; look again and retry: %w", st.ID, kite.ErrConflict)
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
