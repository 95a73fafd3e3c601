package stackbuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// Stack update (issue 13 §1): stack.update applies another template revision (or the stack's
// own scaled files, stack.scale, ScaleFiles) to a built stack, as a durable job on the stack's
// lease, like stack.apply. Start reading at RunUpdate (update_job.go; the plan's diff is
// update_diff.go). What the job would refuse before changing anything (planUpdate: files
// Terraform or the policy refuses, no machine left, a constraint, a machine changing provider)
// is refused by the call itself, with no job (CheckUpdate).
//
// The update plans the new files twice: once alone (as stack.create does: which machines the
// files declare, by label), then, rendered with every machine's agent, against the stack's
// Terraform state, which says per machine what Terraform would do (add, change in place,
// replace, remove, nothing). A machine that stays is rendered with the agent configuration it
// was built with (Machine.AgentSealed), so its user data, and with it the machine, its disk,
// its agent and its terminal sessions, do not change. New and replaced machines get new agent
// keys; the planner waits only for their agents. Removed machines' keys are revoked and their
// records deleted once Terraform no longer has them.
//
// Durability: the stack is Building with the job's id while the job runs (the reconciler and
// stack.reset treat it as they treat a build). The new files, revision and machine records are
// written before Terraform runs; new and replaced machines are Building, removed ones
// Terminating, so a job recovered after a restart (Terraform's run recorded as the stack's
// TFJobID) knows whom to wait for and what to delete. A job that dies before its run was
// recorded, or fails, leaves the stack Failed with the new files: `kloud stack update` again
// converges it (or destroy).

// JobUpdate is the job kind of stack.update (and stack.scale, and stack.apply of a stack a
// failed update left).
const JobUpdate = "stack.update"

// UpdateParams are a stack.update job's parameters (job.get shows them; files and variables
// as JSON text, as they always were).
type UpdateParams struct {
	StackID   string                            `json:"stackId"`
	Lease     string                            `json:"lease"`
	From      string                            `json:"from"` // the stack's state before the job: it goes back to it if nothing changed
	Rev       int                               `json:"rev"`
	Diverged  bool                              `json:"diverged"`
	Files     store.JSONText[[]model.File]      `json:"files"`
	Variables store.JSONText[map[string]string] `json:"variables"`
	// What the update does in words, for the job's log, when it is not "from revision R to S"
	// (stack.scale: "scaling web from 2 to 3 machines").
	What string `json:"what"`
}

// Validate checks params decoded from a job (a job without a stack, lease owner or files was
// not made by stack.update, or its document is damaged) and takes an unknown From as Failed.
func (p *UpdateParams) Validate() error {
	if p.StackID == "" {
		return errors.New("stack.update job without a stackId")
	}
	if p.Lease == "" {
		return fmt.Errorf("stack.update job of stack %s without a lease owner", p.StackID)
	}
	if len(p.Files.V) == 0 {
		return fmt.Errorf("stack.update job of stack %s: no files", p.StackID)
	}
	if p.From != model.StackInitialized && p.From != model.StackFailed {
		p.From = model.StackFailed
	}
	return nil
}

// ---- the calls' side: checks and the preview

// CheckUpdate is what the update job of files and vars would refuse before changing anything
// (files Terraform or the template policy refuses, no machine left, a constraint, a machine
// that would change provider), refused at the call (as c), before a job exists. The job checks
// again: it may run after a restart.
func (f *Flow) CheckUpdate(ctx context.Context, c Caller, st *model.Stack, files []model.File, vars map[string]string) error {
	_, _, _, err := f.planUpdate(ctx, c, st, files, vars, nil)
	return err
}

// PreviewUpdate is stack.plan of a stack: what an update of st to files and vars would do, per
// machine, and the machines the files declare. It changes nothing: the plan runs against the
// stack's Terraform state as a preview (tfapi.Request.Preview), which puts the stack's stored
// files and variables back, so a later destroy never runs the previewed files; machines that
// stay are rendered with their agents, new ones with a placeholder. The caller holds the
// stack's lease meanwhile. The plan's FromRev, ToRev and Diverged are the caller's to fill.
func (f *Flow) PreviewUpdate(ctx context.Context, c Caller, st *model.Stack, files []model.File, vars map[string]string) ([]api.PlannedMachine, api.StackUpdatePlan, error) {
	planned, ms, mt, err := f.planUpdate(ctx, c, st, files, vars, nil)
	if err != nil {
		return nil, api.StackUpdatePlan{}, err
	}
	agents := AgentConfigs{}
	for _, m := range mt.kept {
		if cfg, ok := f.OpenAgent(m); ok {
			agents[m.ID] = cfg
		} else {
			agents[m.ID] = f.placeholderAgent(st, m)
		}
	}
	for i := range mt.added {
		agents[mt.added[i].ID] = f.placeholderAgent(st, &mt.added[i])
	}
	tpl, _, err := f.renderFor(ctx, c, st, files, vars, mt, agents)
	if err != nil {
		return nil, api.StackUpdatePlan{}, err
	}
	before := f.stackState(ctx, st.ID)
	changes, err := f.planStack(ctx, nil, st, tpl, true)
	if err != nil {
		return nil, api.StackUpdatePlan{}, err
	}
	up := f.diffMachines(st, planned, ms, changes, before)
	for i := range planned {
		planned[i].Attributes = VisibleAttrs(planned[i].Attributes)
	}
	return planned, up, nil
}

// FailedUpdate reports whether st is Failed by an update (its recorded job is a stack.update):
// its records may then not match its files (machines an update removed, or added, that
// terraform did or did not get to), and stack.apply converges it as an update of its own files
// instead of building every machine again.
//
// When the job is no longer known (expired), a stack whose machines were built before (they
// have agent keys) converges as an update too: that is right after a failed build as well
// (machines terraform made are awaited with the keys they have, the others built).
func (f *Flow) FailedUpdate(ctx context.Context, st *model.Stack) bool {
	if st.State != model.StackFailed {
		return false
	}
	if st.JobID != "" {
		j, err := f.d.Store.Jobs().Get(ctx, st.JobID)
		if err == nil || !errors.Is(err, store.ErrNotFound) {
			return err == nil && j.Kind == JobUpdate
		}
	}
	ms, err := f.StackMachines(ctx, st.ID)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(ms, func(m model.Machine) bool { return m.KiteID != "" })
}

// FillLatestRev sets LatestRev and UpdateAvailable of each stack from its template (stack.describe,
// stack.list). A template that is gone (or unreadable) leaves them unset.
func (f *Flow) FillLatestRev(ctx context.Context, sts []*model.Stack) {
	revs := map[string]int{}
	for _, st := range sts {
		rev, ok := revs[st.TemplateID]
		if !ok {
			if t, err := f.d.Store.Templates().Get(ctx, st.TemplateID); err == nil {
				rev = t.Rev
			}
			revs[st.TemplateID] = rev
		}
		st.LatestRev = rev
		st.UpdateAvailable = rev > st.TemplateRev && st.State != model.StackNotInitialized
	}
}

// ---- planning an update

// planUpdate plans files alone (Plans.PlanFiles) and matches the machines they declare with
// st's records (matchMachines): the checks of an update that change nothing, made by
// stack.update and stack.scale at the call, by stack.plan of a stack, and again by the job.
func (f *Flow) planUpdate(ctx context.Context, c Caller, st *model.Stack, files []model.File, vars map[string]string, logf func(string)) ([]api.PlannedMachine, []model.Machine, *matched, error) {
	planned, err := f.d.Plans.PlanFiles(ctx, c, st, files, vars, logf)
	if err != nil {
		return nil, nil, nil, err
	}
	ms, err := f.StackMachines(ctx, st.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	mt, err := matchMachines(st, planned, ms)
	if err != nil {
		return nil, nil, nil, err
	}
	return planned, ms, mt, nil
}

// matched is a stack's machines matched with the planned ones by label.
type matched struct {
	kept    []*model.Machine // existing machines the new files still declare
	added   []model.Machine  // new records (not stored yet)
	removed []model.Machine  // existing machines the new files no longer declare
	specs   []*provider.MachineSpec
	vacated []string // providers of removed machines that have none in the new files
}

func matchMachines(st *model.Stack, planned []api.PlannedMachine, ms []model.Machine) (*matched, error) {
	byLabel := map[string]*model.Machine{}
	for i := range ms {
		byLabel[ms[i].Label] = &ms[i]
		if ms[i].State.InProgress() {
			return nil, fmt.Errorf("machine %s is %s (a job is changing it); update when it is done: %w", ms[i].Label, ms[i].State, kite.ErrState)
		}
	}
	out := &matched{}
	seen := map[string]bool{}
	for _, pm := range planned {
		seen[pm.Label] = true
		m, ok := byLabel[pm.Label]
		if ok && (m.Provider != pm.Provider || m.Resource != pm.Resource) {
			return nil, fmt.Errorf("machine %s would change from provider %s to %s: kloud cannot update that in place; destroy the stack and create it from the new revision: %w", pm.Label, m.Provider, pm.Provider, kite.ErrInvalidParams)
		}
		if !ok {
			now := time.Now().UTC()
			out.added = append(out.added, model.Machine{ID: store.NewID(), StackID: st.ID, Label: pm.Label, Resource: pm.Resource, Index: pm.Index, Provider: pm.Provider,
				Owner: st.Owner, Team: st.Team, State: provider.Building, Agent: model.Agent{Status: model.AgentNever}, Attributes: VisibleAttrs(pm.Attributes), CreatedAt: now, UpdatedAt: now})
			m = &out.added[len(out.added)-1]
		} else {
			out.kept = append(out.kept, m)
		}
		spec := MachineSpec(m)
		spec.Attributes = pm.Attributes // as planned for the new files (the user script among them)
		out.specs = append(out.specs, spec)
	}
	for _, m := range ms {
		if !seen[m.Label] {
			out.removed = append(out.removed, m)
		}
	}
	for _, m := range out.removed {
		if !slices.ContainsFunc(planned, func(pm api.PlannedMachine) bool { return pm.Provider == m.Provider }) && !slices.Contains(out.vacated, m.Provider) {
			out.vacated = append(out.vacated, m.Provider)
		}
	}
	slices.Sort(out.vacated)
	return out, nil
}

// renderFor builds files again (a provider's rewrite changes the parsed template, so each
// rendering starts from a fresh build) and lets every provider render the agents of mt.specs.
// A provider whose every machine the update removes (mt.vacated) renders no machine but still
// configures itself (its provider block, credentials): terraform needs it to destroy them.
// It also returns the files' bucket claims.
func (f *Flow) renderFor(ctx context.Context, c Caller, st *model.Stack, files []model.File, vars map[string]string, mt *matched, agents AgentConfigs) (*provider.Template, []BucketSpec, error) {
	specs := mt.specs
	vars, err := f.Variables(st, vars)
	if err != nil {
		return nil, nil, err
	}
	b, err := f.d.Templates.Template(ctx, c, st.Team, FileMap(files), st.Credentials, vars, mt.vacated...)
	if err != nil {
		return nil, nil, err
	}
	tpl := &provider.Template{Files: b.Files, Variables: b.Variables, Config: b.Config}
	names := slices.Sorted(maps.Keys(b.Providers))
	for _, v := range mt.vacated {
		if !slices.Contains(names, v) {
			names = append(names, v)
		}
	}
	for _, name := range names {
		p, _ := f.d.Providers.Lookup(name)
		bs := &provider.BaseStack{Provider: p, StackID: st.ID, Team: st.Team, Owner: st.Owner, Template: tpl, Log: f.log.With("stack", st.ID, "provider", name),
			AgentConfig: agents.Config, Vacating: slices.Contains(mt.vacated, name)}
		for _, sp := range specs {
			if sp.Provider == name {
				bs.Machines = append(bs.Machines, sp)
			}
		}
		stack, err := p.Stack(bs)
		if err != nil {
			return nil, nil, fmt.Errorf("provider %s: %w", name, err)
		}
		if tpl, err = stack.ApplyTemplate(ctx, b.Creds[name]); err != nil {
			return nil, nil, fmt.Errorf("provider %s: %w", name, err)
		}
	}
	return tpl, b.Buckets, nil
}

// planStack plans tpl in the stack's own Terraform directory, against its state, and returns
// Terraform's changes. A preview leaves the directory's files as they were; otherwise they
// are tpl's (the update's apply follows). Without a job j it is a call's plan, bounded by the
// plan timeout.
func (f *Flow) planStack(ctx context.Context, j Job, st *model.Stack, tpl *provider.Template, preview bool) ([]tfapi.ResourceChange, error) {
	tf, err := f.d.Terraformer()
	if err != nil {
		return nil, err
	}
	if j == nil { // a plan for a call (stack.plan of a stack): the plan timeout
		var cancel context.CancelFunc
		ctx, cancel = f.d.Plans.PlanContext(ctx)
		defer cancel()
	}
	submit := func() (string, error) {
		return tf.Plan(ctx, tfapi.Request{ContentID: "stack-" + st.ID, Files: tfapi.Files(tpl.Files), Variables: tpl.Variables, Preview: preview})
	}
	var id string
	if j != nil {
		id, err = SubmitTF(ctx, j, submit)
	} else {
		id, err = submit()
	}
	if errors.Is(err, kite.ErrConflict) {
		return nil, fmt.Errorf("terraform is busy with stack %s: plan again when its run is done: %w", st.ID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("terraform plan: %w", err)
	}
	job, err := tf.Wait(ctx, id, nil)
	if ctx.Err() != nil {
		f.StopTF(ctx, id) // a cancelled update leaves no plan running in the stack's directory
		if j == nil {
			return nil, f.d.Plans.PlanStopped(ctx)
		}
		return nil, fmt.Errorf("terraform plan: %w", ctx.Err())
	}
	if job != nil && job.Err() != nil {
		return nil, fmt.Errorf("terraform plan: %s: %w", job.Err().Error(), kite.ErrInvalidParams)
	}
	if err != nil {
		return nil, fmt.Errorf("terraform plan: %w", err)
	}
	if job.Result == nil {
		return nil, nil
	}
	return job.Result.Changes, nil
}

// stackState is the stack's Terraform state, nil if there is none (or it cannot be read).
func (f *Flow) stackState(ctx context.Context, stackID string) *tfjson.State {
	tf, err := f.d.Terraformer()
	if err != nil {
		return nil
	}
	st, err := tf.State(ctx, "stack-"+stackID)
	if err != nil {
		return nil
	}
	return st
}
