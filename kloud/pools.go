package kloud

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// Prebuilt stacks: pool.set, pool.list and pool.delete (an administrator's orders, in the pools
// collection). A pool's stacks are ordinary stacks owned by model.PoolOwner with Stack.Pool set;
// store.Stacks.Claim hands one to a user.

// poolAPI serves pool.*. Server.pools is the one value, made in New.
type poolAPI struct {
	store *store.Store
	srv   *Server
	log   *slog.Logger
}

// set serves pool.set: the pool of a template's stacks (with a preset the template has) and
// its size.
func (a *poolAPI) set(ctx context.Context, c *Caller, _ *kite.Request, p *api.PoolSetParams) (api.PoolView, error) {
	t, err := a.srv.loadTemplate(ctx, c, p.TemplateID)
	if err != nil {
		return api.PoolView{}, err
	}
	if p.Preset != "" {
		cfg, err := tmpl.Parse(fileMap(t.Files))
		if err != nil {
			return api.PoolView{}, fmt.Errorf("template %s: %s: %w", t.ID, err.Error(), kite.ErrInvalidParams)
		}
		ps, err := a.srv.templateParams(cfg)
		if err != nil {
			return api.PoolView{}, err
		}
		if !slices.ContainsFunc(ps.Presets, func(pr tmpl.Preset) bool { return pr.Name == p.Preset }) {
			return api.PoolView{}, fmt.Errorf("template %s has no preset %q: %w", t.ID, p.Preset, kite.ErrInvalidParams)
		}
	}
	pool := model.Pool{ID: model.PoolID(t.ID, p.Preset), Team: t.Team, TemplateID: t.ID, Preset: p.Preset, Size: p.Size,
		Schedule: p.Schedule, TimeZone: p.TimeZone, UpdatedBy: c.Username}
	if err := a.store.Pools().Set(ctx, pool); err != nil {
		return api.PoolView{}, err
	}
	a.log.InfoContext(ctx, "pool set", "pool", pool.ID, "size", pool.Size, "by", c.Username)
	a.srv.kickPools()
	return a.view(ctx, pool)
}

// list serves pool.list.
func (a *poolAPI) list(ctx context.Context, _ *Caller, _ *kite.Request, p *api.PoolListParams) (api.PoolListResult, error) {
	ps, err := a.store.Pools().List(ctx, p.Team)
	if err != nil {
		return api.PoolListResult{}, err
	}
	out := api.PoolListResult{Pools: []api.PoolView{}}
	for _, pool := range ps {
		v, err := a.view(ctx, pool)
		if err != nil {
			return api.PoolListResult{}, err
		}
		out.Pools = append(out.Pools, v)
	}
	return out, nil
}

// delete serves pool.delete: the pool goes; its idle stacks are destroyed by the pools'
// reconciler, the claimed ones stay their users'.
func (a *poolAPI) delete(ctx context.Context, c *Caller, _ *kite.Request, p *api.PoolRef) (api.DeleteResult, error) {
	if _, err := a.store.Pools().Get(ctx, p.ID); errors.Is(err, store.ErrNotFound) {
		return api.DeleteResult{}, notFound("pool", p.ID)
	} else if err != nil {
		return api.DeleteResult{}, err
	}
	if err := a.store.Pools().Delete(ctx, p.ID); err != nil {
		return api.DeleteResult{}, err
	}
	a.log.InfoContext(ctx, "pool deleted", "pool", p.ID, "by", c.Username)
	a.srv.kickPools()
	return api.DeleteResult{Deleted: true}, nil
}

// view counts pool's stacks.
func (a *poolAPI) view(ctx context.Context, pool model.Pool) (api.PoolView, error) {
	v := api.PoolView{Pool: pool, Current: api.PoolSize(pool, a.store.Now())}
	t, err := a.store.Templates().Get(ctx, pool.TemplateID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return v, err
	}
	v.Rev = t.Rev
	sts, err := a.store.Stacks().OfPool(ctx, pool.ID)
	if err != nil {
		return v, err
	}
	for _, st := range sts {
		switch {
		case st.State == model.StackFailed:
			v.Failed++
		case st.TemplateRev != v.Rev:
			v.Stale++
		case st.State == model.StackInitialized:
			v.Ready++
		default:
			v.Building++
		}
	}
	if v.Claimed, err = a.store.Stacks().CountClaimed(ctx, pool.ID); err != nil {
		return v, err
	}
	return v, nil
}

// claimFromPool serves stack.create from a pool when it can: p asks for the template's latest
// revision with no values of its own (no parameters, variables or credentials; its preset, or
// the template's default one, is the pool's), a pool of it exists and has a stack ready, and the
// caller's quota takes that stack's machines. Then the stack is the caller's in one atomic
// update (store.Stacks.Claim: no stack goes to two users), its machines follow, and a
// stack.claim job hands the machines over to the caller's agent keys and account (handover.go).
// ok is false when stack.create must build a stack as usual.
func (a *stackAPI) claimFromPool(ctx context.Context, c *Caller, p *api.StackPlanParams) (res api.StackCreateResult, ok bool, err error) {
	if len(p.Parameters) > 0 || len(p.Variables) > 0 || len(p.Credentials) > 0 {
		return res, false, nil
	}
	t, files, err := a.templateFiles(ctx, c, p)
	if err != nil {
		return res, false, err
	}
	if cur := a.srv.stackTemplate(ctx, t.ID); cur == nil || cur.Rev != t.Rev {
		return res, false, nil // an older revision: built as asked
	}
	params, err := a.srv.resolveParams(fileMap(files), p)
	if err != nil {
		return res, false, nil // stack.create says what is wrong, as usual
	}
	pool, err := a.store.Pools().Get(ctx, model.PoolID(t.ID, params.preset))
	if errors.Is(err, store.ErrNotFound) {
		return res, false, nil
	} else if err != nil {
		return res, false, err
	}
	ready, err := a.stacks.OfPool(ctx, pool.ID)
	if err != nil {
		return res, false, err
	}
	i := slices.IndexFunc(ready, func(st model.Stack) bool {
		return st.TemplateRev == t.Rev && st.State == model.StackInitialized
	})
	if i < 0 {
		return res, false, nil
	}
	// The caller's quota, with the candidate's machines (every ready stack of the pool has the
	// same): held across the check and the claim, so two creates of one user cannot both pass.
	ms, err := a.machines.ByStack(ctx, ready[i].ID)
	if err != nil {
		return res, false, err
	}
	planned := plannedOf(ms)
	release, err := a.checks.holdQuota(ctx, c.Username, t.Team)
	if err != nil {
		return res, false, err
	}
	defer release()
	if err := a.checks.checkQuota(ctx, c.Username, t.Team, ready[i].ID, planned); err != nil {
		return res, false, err
	}
	title := p.Title
	if title == "" {
		title = t.Title
	}
	jobID := store.NewID() // recorded by the claim: reconcileClaims starts it if this create is cut first
	st, ok, err := a.stacks.Claim(ctx, pool.ID, t.Rev, c.Username, title, jobID)
	if err != nil || !ok {
		return res, false, err // none left: built as usual
	}
	if err := a.machines.SetOwner(ctx, st.ID, c.Username); err != nil {
		return res, false, err
	}
	if err := a.store.BucketClaims().SetOwner(ctx, st.ID, c.Username); err != nil {
		return res, false, err
	}
	job, err := stackClaimJob.StartID(ctx, a.srv.(*Server), jobID, "stack/"+st.ID, c.Username, claimParams{StackID: st.ID})
	if err != nil {
		return res, false, fmt.Errorf("stack %s claimed; hand its machines over: %w", st.ID, err)
	}
	if ms, err = a.machines.ByStack(ctx, st.ID); err != nil {
		return res, false, err
	}
	a.log.InfoContext(ctx, "stack claimed from a pool", "stack", st.ID, "pool", pool.ID, "owner", c.Username)
	a.srv.(*Server).kickPools() // the pool builds its next stack now
	return api.StackCreateResult{Stack: st, Machines: ms, Claimed: true, JobID: job}, true, nil
}

// claimParams are a stack.claim job's: the claimed stack.
type claimParams struct {
	StackID string `json:"stackId"`
}

// claimResult is a stack.claim job's result.
type claimResult struct {
	Machines int `json:"machines"` // handed over
}

// jobStackClaim hands a claimed pool stack's machines to their owner (handover.go).
const jobStackClaim = "stack.claim"

var stackClaimJob = jobKind[claimParams, claimResult]{name: jobStackClaim,
	run: func(ctx context.Context, j *jobCtx, p claimParams) (claimResult, error) {
		return j.s.runClaim(ctx, j, p)
	},
	recover: func(ctx context.Context, j *jobCtx, p claimParams) (claimResult, error) {
		return j.s.runClaim(ctx, j, p) // each machine's handover goes on from its record
	},
}

// runClaim hands every machine of the claimed stack over to its owner.
func (s *Server) runClaim(ctx context.Context, j *jobCtx, p claimParams) (claimResult, error) {
	st, err := s.store.Stacks().Get(ctx, p.StackID)
	if err != nil {
		return claimResult{}, err
	}
	// stack.create gave the machines and bucket claims to the owner after the claim; again here
	// (idempotent) for a create cut between those writes and this job.
	if err := s.store.Machines().SetOwner(ctx, st.ID, st.Owner); err != nil {
		return claimResult{}, err
	}
	if err := s.store.BucketClaims().SetOwner(ctx, st.ID, st.Owner); err != nil {
		return claimResult{}, err
	}
	ms, err := s.store.Machines().ByStack(ctx, st.ID)
	if err != nil {
		return claimResult{}, err
	}
	var out claimResult
	for _, m := range ms {
		if err := s.handOver(ctx, &st, m); err != nil {
			return out, err
		}
		out.Machines++
		j.Logf(ctx, "machine %s is %s's: its agent registered with %s's key", m.Label, st.Owner, st.Owner)
	}
	return out, nil
}

// kickPools makes the jobs loop reconcile the pools now, not at its next interval.
func (s *Server) kickPools() {
	select {
	case s.poolKick <- struct{}{}:
	default: // one is pending
	}
}

// reconcilePools keeps every pool at its size, one pass at a time across replicas (the sweep
// lease "sweep/pools"): builds the stacks a pool lacks, destroys its failed ones, those of an
// older template revision and those beyond its size (idle ones only: never one a job is
// changing), and the idle stacks of pools that were deleted. Builds and destroys are the usual
// durable jobs, in model.PoolOwner's name.
func (s *Server) reconcilePools(ctx context.Context) {
	s.sweeps().periodic(ctx, "pools", func(ctx context.Context) error {
		pools, err := s.store.Pools().List(ctx, "")
		if err != nil {
			return err
		}
		c, err := s.callerByName(ctx, model.PoolOwner, false)
		if err != nil {
			return err
		}
		live := map[string]bool{}
		for _, pool := range pools {
			live[pool.ID] = true
			problem := ""
			if err := s.reconcilePool(ctx, c, pool); err != nil {
				problem = err.Error()
			}
			if problem != pool.Problem { // said once, and shown by pool.list
				if problem != "" {
					s.log.WarnContext(ctx, "pool below its size", "pool", pool.ID, "err", problem)
				}
				if err := s.store.Pools().SetProblem(ctx, pool.ID, problem); err != nil {
					return err
				}
			}
		}
		s.reconcileClaims(ctx)
		orphans, err := s.store.Stacks().Pooled(ctx)
		if err != nil {
			return err
		}
		for _, st := range orphans {
			if !live[st.Pool] && !slices.Contains(stackTransitional, st.State) {
				s.poolDestroy(ctx, c, st, "its pool was deleted")
			}
		}
		return nil
	})
}

// claimJobGrace is how long after a claim its create may still be starting the handover job;
// claimJobWindow is how far back reconcileClaims looks for claims whose job never started.
const (
	claimJobGrace  = time.Minute
	claimJobWindow = 24 * time.Hour
)

// reconcileClaims starts the handover job of each stack claimed in the last claimJobWindow whose
// stack.create was cut between the claim and the job's start (the stack names a job that does
// not exist, claimJobGrace after the claim): every state has an exit, and this one is the job's.
func (s *Server) reconcileClaims(ctx context.Context) {
	now := s.store.Now()
	sts, err := s.store.Stacks().ClaimedSince(ctx, now.Add(-claimJobWindow))
	if err != nil {
		s.log.WarnContext(ctx, "claimed stacks", "err", err)
		return
	}
	for _, st := range sts {
		if st.JobID == "" || now.Sub(st.ClaimedAt) < claimJobGrace {
			continue
		}
		if _, err := s.store.Jobs().Get(ctx, st.JobID); !errors.Is(err, store.ErrNotFound) {
			continue // started (whatever became of it), or the store cannot say now
		}
		if _, err := stackClaimJob.StartID(ctx, s, st.JobID, "stack/"+st.ID, st.Owner, claimParams{StackID: st.ID}); err != nil {
			s.log.WarnContext(ctx, "start a claimed stack's handover", "stack", st.ID, "job", st.JobID, "err", err)
			continue
		}
		s.log.InfoContext(ctx, "started a claimed stack's handover its create never started", "stack", st.ID, "job", st.JobID, "owner", st.Owner)
	}
}

// reconcilePool brings pool to its size.
func (s *Server) reconcilePool(ctx context.Context, c *Caller, pool model.Pool) error {
	size, rev := api.PoolSize(pool, s.store.Now()), 0 // its schedule's size now
	t, err := s.store.Templates().Get(ctx, pool.TemplateID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		size = 0 // the template is gone: so is what it built
	case err != nil:
		return err
	default:
		rev = t.Rev
	}
	sts, err := s.store.Stacks().OfPool(ctx, pool.ID)
	if err != nil {
		return err
	}
	keep := 0
	for _, st := range sts {
		switch { // (a stack keeps its last job's id: its state says whether a job changes it)
		case slices.Contains(stackTransitional, st.State):
			if st.TemplateRev == rev && st.State == model.StackBuilding {
				keep++
			}
		case st.State == model.StackFailed:
			s.poolDestroy(ctx, c, st, "its build failed: "+st.Reason)
		case st.TemplateRev != rev:
			s.poolDestroy(ctx, c, st, fmt.Sprintf("of template revision %d, the pool builds %d", st.TemplateRev, rev))
		case keep >= size:
			s.poolDestroy(ctx, c, st, fmt.Sprintf("beyond the pool's size %d", size))
		case st.State == model.StackNotInitialized:
			if _, err := s.stacks.apply(ctx, c, nil, &api.StackApplyParams{StackID: st.ID}); err != nil {
				return fmt.Errorf("build stack %s: %w", st.ID, err)
			}
			keep++
		default: // built and idle: ready to be claimed
			keep++
		}
	}
	if keep < size {
		// A pool at its quota would plan a stack (a terraform run) each pass only to be
		// refused: check with the machines of a stack of this revision it has, when there is
		// one (every stack of the pool plans the same).
		if i := slices.IndexFunc(sts, func(st model.Stack) bool { return st.TemplateRev == rev }); i >= 0 {
			ms, err := s.store.Machines().ByStack(ctx, sts[i].ID)
			if err != nil {
				return err
			}
			if err := s.checkQuota(ctx, model.PoolOwner, pool.Team, "", plannedOf(ms)); err != nil {
				return fmt.Errorf("%d of %d stacks: %w", keep, size, err)
			}
		}
	}
	for ; keep < size; keep++ {
		preset := pool.Preset
		res, err := s.stacks.createStack(ctx, c, &api.StackPlanParams{TemplateID: pool.TemplateID, Preset: &preset}, pool.ID)
		if err != nil {
			return fmt.Errorf("create a stack: %w", err)
		}
		if _, err := s.stacks.apply(ctx, c, nil, &api.StackApplyParams{StackID: res.Stack.ID}); err != nil {
			return fmt.Errorf("build stack %s: %w", res.Stack.ID, err)
		}
		s.log.InfoContext(ctx, "pool stack building", "pool", pool.ID, "stack", res.Stack.ID, "rev", rev)
	}
	return nil
}

// poolDestroy starts the destroy of pool stack st, saying why.
func (s *Server) poolDestroy(ctx context.Context, c *Caller, st model.Stack, why string) {
	if _, err := s.stacks.apply(ctx, c, nil, &api.StackApplyParams{StackID: st.ID, Destroy: true}); err != nil {
		s.log.WarnContext(ctx, "destroy a pool stack", "stack", st.ID, "pool", st.Pool, "why", why, "err", err)
		return
	}
	s.log.InfoContext(ctx, "pool stack destroying", "stack", st.ID, "pool", st.Pool, "why", why)
}
