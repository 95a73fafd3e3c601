package kloud

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Stack update (issue 13 §1): stack.update applies another template revision (or the stack's
// own scaled files, stack.scale in stacks_scale.go) to a built stack, as a durable job on the
// stack's lease, like stack.apply. The job is kloud/stackbuild's (update.go there says how an
// update works, update_job.go runs it); here are the calls that start it (what the job would
// refuse before changing anything is refused by the call itself, with no job) and stack.plan of
// a stack, its preview.

const jobStackUpdate = stackbuild.JobUpdate

// updateParams are a stack.update job's parameters (stackbuild.UpdateParams).
type updateParams = stackbuild.UpdateParams

func stackPtrs(sts []model.Stack) []*model.Stack {
	out := make([]*model.Stack, len(sts))
	for i := range sts {
		out[i] = &sts[i]
	}
	return out
}

// ---- RPCs

// updateTarget returns the files of revision rev (0: the latest) of st's template.
func (a *stackAPI) updateTarget(ctx context.Context, c *Caller, st *model.Stack, rev int) ([]model.File, int, error) {
	t, files, err := a.templateFiles(ctx, c, &api.StackPlanParams{TemplateID: st.TemplateID, Rev: rev})
	if errors.Is(err, kite.ErrNotFound) && rev == 0 {
		return nil, 0, fmt.Errorf("stack %s: its template %s is gone (or not yours to read): nothing to update to: %w", st.ID, st.TemplateID, kite.ErrNotFound)
	}
	if err != nil {
		return nil, 0, err
	}
	return files, t.Rev, nil
}

// update serves stack.update: an update job to another revision of the stack's template.
func (a *stackAPI) update(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackUpdateParams) (api.JobRef, error) {
	st, err := a.srv.loadStack(ctx, c, p.StackID)
	if err != nil {
		return api.JobRef{}, err
	}
	files, rev, err := a.updateTarget(ctx, c, st, p.TemplateRevision)
	if err != nil {
		return api.JobRef{}, err
	}
	vars := st.Variables
	diverged := false
	if len(p.Parameters) > 0 { // params.go: refused before a job when a value may not change
		// A scaled stack's parameters changed at its own revision: its own files (the scale
		// stays), as stack.scale keeps them.
		if st.Diverged && rev == st.TemplateRev {
			files, diverged = st.Files, true
		}
		if vars, err = a.srv.updateParamValues(st, files, p.Parameters); err != nil {
			return api.JobRef{}, err
		}
	}
	return a.startUpdate(ctx, c, st, updateParams{StackID: st.ID, Rev: rev, Diverged: diverged, Files: store.JSONTextOf(files), Variables: store.JSONTextOf(vars)})
}

// startUpdate starts the update job as stack.apply starts its job (beginStackJob, stacks.go),
// once the update's checks passed.
func (a *stackAPI) startUpdate(ctx context.Context, c *Caller, st *model.Stack, up updateParams) (api.JobRef, error) {
	if st.State == model.StackNotInitialized {
		return api.JobRef{}, fmt.Errorf("stack %s was never built: build it with `kloud stack apply %s` (it builds its recorded revision %d): %w", st.ID, st.ID, st.TemplateRev, kite.ErrState)
	}
	release, err := a.checks.holdQuota(ctx, st.Owner, st.Team) // quota.go: held until the stack is Building
	if err != nil {
		return api.JobRef{}, err
	}
	defer release()
	sj := stackJob{lease: "update", verb: "be updated", noun: "update", from: []string{model.StackInitialized, model.StackFailed}, to: model.StackBuilding,
		set: store.StackSet{TFJobID: new("")}}
	return a.beginStackJob(ctx, c, st, sj, func(st *model.Stack, lease string) (jobSpec, error) {
		// Refused here, before a job exists, what the job would refuse before changing
		// anything; the job checks again (it may run after a restart).
		if err := a.srv.flow().CheckUpdate(ctx, c, st, up.Files.V, up.Variables.V); err != nil {
			return jobSpec{}, err
		}
		up.Lease, up.From = lease, st.State
		return stackUpdateJob.spec(up)
	})
}

// planUpdate is stack.plan of a stack: what stack.update to the revision would do, per
// machine (stackbuild's PreviewUpdate: it changes nothing). It holds the stack's lease
// meanwhile.
func (a *stackAPI) planUpdate(ctx context.Context, c *Caller, p *api.StackPlanParams) (api.StackPlanResult, error) {
	st, err := a.srv.loadStack(ctx, c, p.StackID)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	if st.State != model.StackInitialized && st.State != model.StackFailed {
		return api.StackPlanResult{}, fmt.Errorf("stack %s is %s: an update can be planned for a built stack (Initialized or Failed): %w", st.ID, st.State, kite.ErrState)
	}
	files, rev, err := a.updateTarget(ctx, c, st, p.Rev)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	_, release, err := a.srv.flow().TakeLease(ctx, "stack/"+st.ID, "plan", "stack "+st.ID+" is busy (a job is changing it; plan when it is done)")
	if err != nil {
		return api.StackPlanResult{}, err
	}
	defer release()
	planned, up, err := a.srv.flow().PreviewUpdate(ctx, c, st, files, st.Variables)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	up.FromRev, up.ToRev, up.Diverged = st.TemplateRev, rev, st.Diverged
	return api.StackPlanResult{Machines: planned, TemplateID: st.TemplateID, Rev: rev, Update: &up}, nil
}

// reapplyUpdate is stack.apply of a stack a failed update left (stackbuild's FailedUpdate): an
// update to the stack's own files, revision and variables. Machines that stayed Running keep
// their agents and disks; the others are built (or, if terraform made them, awaited) and the
// removed ones removed.
func (a *stackAPI) reapplyUpdate(ctx context.Context, c *Caller, st *model.Stack) (api.JobRef, error) {
	return a.startUpdate(ctx, c, st, updateParams{StackID: st.ID, Rev: st.TemplateRev, Diverged: st.Diverged, Files: store.JSONTextOf(st.Files), Variables: store.JSONTextOf(st.Variables),
		What: fmt.Sprintf("applying revision %d again (only what drifted changes)", st.TemplateRev)})
}

// PlanFiles plans files alone (no state) for stack st and returns the machines they declare
// (stackbuild.Plans): built with the stack's credentials, within the machine cap, the
// constraints and the quotas (the bucket quotas too).
func (a *stackAPI) PlanFiles(ctx context.Context, c stackbuild.Caller, st *model.Stack, files []model.File, vars map[string]string, logf func(string)) ([]api.PlannedMachine, error) {
	cc, _ := c.(*Caller)
	vars, err := a.srv.flow().Variables(st, vars)
	if err != nil {
		return nil, err
	}
	b, err := a.build(ctx, cc, st.Team, fileMap(files), st.Credentials, vars)
	if err != nil {
		return nil, err
	}
	if err := a.checks.capBuild(a.srv.stackTemplate(ctx, st.TemplateID), b); err != nil { // limits.go
		return nil, err
	}
	// A plan of an earlier attempt (a cancelled update, a preview) may still hold the content
	// id for a moment: wait for it.
	var planned []api.PlannedMachine
	for said := false; ; {
		// Constraints are the stack owner's (a vagrant host is its owner's), not the caller's.
		planned, err = a.plan(ctx, "update-"+st.ID, b, st.Owner, nil) // its lines would say "create" of every machine
		if !errors.Is(err, kite.ErrConflict) {
			break
		}
		if !said && logf != nil {
			logf(fmt.Sprintf("terraform is still busy with an earlier plan of this stack (%v); waiting", err))
		}
		said = true
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(2 * time.Second):
		}
	}
	if err != nil {
		return nil, err
	}
	if len(planned) == 0 {
		return nil, fmt.Errorf("stack %s would have no machines left (its new files declare none; machine resource types: %s); a stack has at least one machine: destroy the stack instead (kloud stack destroy %s): %w",
			st.ID, strings.Join(a.srv.resourceTypes(), ", "), st.ID, kite.ErrInvalidParams)
	}
	if err := a.checks.checkQuota(ctx, st.Owner, st.Team, st.ID, planned); err != nil { // quota.go
		return nil, err
	}
	if err := a.checks.checkBucketQuota(ctx, st.Owner, st.Team, st.ID, b.buckets); err != nil { // quota.go
		return nil, err
	}
	return planned, nil
}
