package kloud

import (
	"context"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// reconcileInterval is the reconciler's period (Options.ReconcileInterval); the reconciler
// itself is kloud/stackbuild's (reconcile.go there).
func (s *Server) reconcileInterval() time.Duration { return s.opts.ReconcileInterval }

// reconcile is one pass of the reconciler over every stack and machine in a transition, under
// the sweep lease "sweep/reconcile" (sweeps.go): skipped while another replica's pass runs.
func (s *Server) reconcile(ctx context.Context) {
	s.sweeps().periodic(ctx, "reconcile", func(ctx context.Context) error {
		s.flow().Reconcile(ctx)
		return nil
	})
}

// stackTransitional are the states of a stack that a job is changing.
var stackTransitional = []string{model.StackBuilding, model.StackDestroying}

// Reset: an administrator's way out of any state.

// reset (stack.reset) forces a stack and its machines out of any state: to Failed (machines in a
// transition become Unknown) or, if nothing was ever built, to NotInitialized (every machine
// NotInitialized). Only kloud administrators, only when no job is live for the stack or its
// machines (it holds the stack's lease meanwhile, so none starts); stackbuild's Reset does it.
func (a *stackAPI) reset(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackResetParams) (api.StackView, error) {
	if !c.Admin {
		return api.StackView{}, fmt.Errorf("stack.reset is for kloud administrators: %w", kite.ErrPermission)
	}
	st, err := a.srv.loadStack(ctx, nil, p.StackID)
	if err != nil {
		return api.StackView{}, err
	}
	owner, release, err := a.srv.flow().TakeLease(ctx, "stack/"+st.ID, "reset", "stack "+st.ID+" is busy (a job holds it; cancel it first)")
	if err != nil {
		return api.StackView{}, err
	}
	defer release()
	if st, err = a.srv.loadStack(ctx, nil, st.ID); err != nil { // as it is now that it is ours
		return api.StackView{}, err
	}
	if err := a.srv.flow().Reset(ctx, st, owner, c.Username, p.State, p.Reason); err != nil {
		return api.StackView{}, err
	}
	return a.describe(ctx, c, nil, &api.StackRef{StackID: st.ID})
}
