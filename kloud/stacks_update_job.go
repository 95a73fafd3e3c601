package kloud

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// The stack.update job (stacks_update.go has the calls that start it and what it shares).

// ---- the job

func (s *Server) runStackUpdate(ctx context.Context, j *jobCtx, p updateParams, recovering bool) (res stackbuild.StackResult, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("internal error: %v", r)
		}
		if err != nil {
			var un untouched
			if errors.As(err, &un) {
				s.restoreStack(ctx, j, p, err)
			}
			s.flow().ExitStack(ctx, j, p.StackID, StackBuilding, err)
		}
	}()
	st, c, stop, err := s.resumeStackJob(ctx, j, recovering, p.StackID, p.Lease, StackBuilding)
	defer stop()
	if err != nil {
		return stackbuild.StackResult{}, err
	}
	tf, err := s.terraformer()
	if err != nil {
		return stackbuild.StackResult{}, err
	}
	tfJob := st.TFJobID
	resumed := false
	if recovering && tfJob == "" {
		// Killed before terraform's run was recorded: the new files and records may be written,
		// terraform may or may not have started. The update starts again from what is there
		// (terraformer's lease makes a new run wait for an old one): machines this attempt
		// moved are settled first, so the plan sees new ones as kept (awaited, being Unknown)
		// and removed ones as removed.
		j.Logf(ctx, "kloud restarted before terraform's run was recorded; updating again")
		if err := s.unsettleInterrupted(ctx, st.ID); err != nil {
			return stackbuild.StackResult{}, err
		}
		if st, err = s.loadStack(ctx, nil, p.StackID); err != nil {
			return stackbuild.StackResult{}, err
		}
		recovering, resumed = false, true
	}
	if !recovering {
		if tfJob, err = s.prepareUpdate(ctx, j, c, st, p, resumed); err != nil {
			return stackbuild.StackResult{}, err
		}
	}
	if ctx.Err() != nil {
		return stackbuild.StackResult{}, s.failUpdate(ctx, st, nil, tfJob, fmt.Errorf("terraform apply: %w", ctx.Err()))
	}
	job, err := tf.Wait(ctx, tfJob, stackbuild.ApplyProgress(ctx, j))
	if err != nil {
		return stackbuild.StackResult{}, s.failUpdate(ctx, st, nil, tfJob, fmt.Errorf("terraform apply: %w", err))
	}
	if err := job.Err(); err != nil {
		return stackbuild.StackResult{}, s.failUpdate(ctx, st, job.Result, tfJob, fmt.Errorf("terraform apply: %w", err))
	}
	return s.finishUpdate(ctx, j, c, st, job.Result)
}

// planUpdate plans files alone (planFiles) and matches the machines they declare with st's
// records (matchMachines): the checks of an update that change nothing, made by stack.update and
// stack.scale at the call, by stack.plan of a stack, and again by the job.
func (s *Server) planUpdate(ctx context.Context, c *Caller, st *Stack, files []File, vars map[string]string, logf func(string)) ([]api.PlannedMachine, []Machine, *matched, error) {
	planned, err := s.planFiles(ctx, c, st, files, vars, logf)
	if err != nil {
		return nil, nil, nil, err
	}
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	mt, err := matchMachines(st, planned, ms)
	if err != nil {
		return nil, nil, nil, err
	}
	return planned, ms, mt, nil
}

// planFiles plans files alone (no state) and returns the machines they declare.
func (s *Server) planFiles(ctx context.Context, c *Caller, st *Stack, files []File, vars map[string]string, logf func(string)) ([]api.PlannedMachine, error) {
	b, err := s.build(ctx, c, st.Team, fileMap(files), st.Credentials, vars)
	if err != nil {
		return nil, err
	}
	if err := s.capBuild(s.stackTemplate(ctx, st.TemplateID), b); err != nil { // limits.go
		return nil, err
	}
	// A plan of an earlier attempt (a cancelled update, a preview) may still hold the content
	// id for a moment: wait for it.
	var planned []api.PlannedMachine
	for said := false; ; {
		// Constraints are the stack owner's (a vagrant host is its owner's), not the caller's.
		planned, err = s.plan(ctx, "update-"+st.ID, b, st.Owner, nil) // its lines would say "create" of every machine
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
			st.ID, strings.Join(s.resourceTypes(), ", "), st.ID, kite.ErrInvalidParams)
	}
	if err := s.checkQuota(ctx, st.Owner, st.Team, st.ID, planned); err != nil { // quota.go
		return nil, err
	}
	return planned, nil
}

// matched is the stack's machines matched with the planned ones by label.
type matched struct {
	kept    []*Machine // existing machines the new files still declare
	added   []Machine  // new records (not stored yet)
	removed []Machine  // existing machines the new files no longer declare
	specs   []*provider.MachineSpec
	vacated []string // providers of removed machines that have none in the new files
}

func matchMachines(st *Stack, planned []api.PlannedMachine, ms []Machine) (*matched, error) {
	byLabel := map[string]*Machine{}
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
			out.added = append(out.added, Machine{ID: store.NewID(), StackID: st.ID, Label: pm.Label, Resource: pm.Resource, Index: pm.Index, Provider: pm.Provider,
				Owner: st.Owner, Team: st.Team, State: provider.Building, Agent: Agent{Status: AgentNever}, Attributes: stackbuild.VisibleAttrs(pm.Attributes), CreatedAt: now, UpdatedAt: now})
			m = &out.added[len(out.added)-1]
		} else {
			out.kept = append(out.kept, m)
		}
		spec := stackbuild.MachineSpec(m)
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
func (s *Server) renderFor(ctx context.Context, c *Caller, st *Stack, files []File, vars map[string]string, mt *matched, agents agentConfigs) (*provider.Template, error) {
	specs := mt.specs
	b, err := s.build(ctx, c, st.Team, fileMap(files), st.Credentials, vars, mt.vacated...)
	if err != nil {
		return nil, err
	}
	tpl := &provider.Template{Files: b.files, Variables: b.variables, Config: b.cfg}
	names := slices.Sorted(maps.Keys(b.providers))
	for _, v := range mt.vacated {
		if !slices.Contains(names, v) {
			names = append(names, v)
		}
	}
	for _, name := range names {
		p, _ := s.providers.Lookup(name)
		bs := &provider.BaseStack{Provider: p, StackID: st.ID, Team: st.Team, Owner: st.Owner, Template: tpl, Log: s.log.With("stack", st.ID, "provider", name),
			AgentConfig: agents.Config, Vacating: slices.Contains(mt.vacated, name)}
		for _, sp := range specs {
			if sp.Provider == name {
				bs.Machines = append(bs.Machines, sp)
			}
		}
		stack, err := p.Stack(bs)
		if err != nil {
			return nil, fmt.Errorf("provider %s: %w", name, err)
		}
		if tpl, err = stack.ApplyTemplate(ctx, b.creds[name]); err != nil {
			return nil, fmt.Errorf("provider %s: %w", name, err)
		}
	}
	return tpl, nil
}

// planStack plans tpl in the stack's own Terraform directory, against its state, and returns
// Terraform's changes. A preview leaves the directory's files as they were; otherwise they
// are tpl's (the update's apply follows).
func (s *Server) planStack(ctx context.Context, j *jobCtx, st *Stack, tpl *provider.Template, preview bool) ([]tfapi.ResourceChange, error) {
	tf, err := s.terraformer()
	if err != nil {
		return nil, err
	}
	if j == nil { // a plan for a call (stack.plan of a stack): the plan timeout, limits.go
		var cancel context.CancelFunc
		ctx, cancel = s.planCtx(ctx)
		defer cancel()
	}
	submit := func() (string, error) {
		return tf.Plan(ctx, tfapi.Request{ContentID: "stack-" + st.ID, Files: tfFiles(tpl.Files), Variables: tpl.Variables, Preview: preview})
	}
	var id string
	if j != nil {
		id, err = submitTF(ctx, j, submit)
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
		s.stopTF(ctx, id) // a cancelled update leaves no plan running in the stack's directory
		if j == nil {
			return nil, s.planStopped(ctx)
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
func (s *Server) stackState(ctx context.Context, stackID string) *tfjson.State {
	tf, err := s.terraformer()
	if err != nil {
		return nil
	}
	st, err := tf.State(ctx, "stack-"+stackID)
	if err != nil {
		return nil
	}
	return st
}

// unsettleInterrupted moves the machines of stack id an interrupted update attempt left Building
// or Terminating to Unknown, so the next attempt can plan them.
func (s *Server) unsettleInterrupted(ctx context.Context, id string) error {
	ms, err := s.flow().StackMachinesRetry(ctx, id)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.State == provider.Building || m.State == provider.Terminating {
			s.setMachine(ctx, m.ID, []provider.State{m.State}, store.MachineSet{State: new(string(provider.Unknown)), Reason: new("an update was interrupted (kloud restarted)")})
		}
	}
	return nil
}

// prepareUpdate plans the update, writes the new files and machine records, mints the keys of
// new and replaced machines, and submits terraform apply. It returns terraform's run. resumed:
// an earlier attempt of the job may have written files and records already.
func (s *Server) prepareUpdate(ctx context.Context, j *jobCtx, c *Caller, st *Stack, p updateParams, resumed bool) (string, error) {
	fail := func(err error) (string, error) { return "", err }
	failClean := func(err error) (string, error) { // nothing written yet
		if resumed {
			return "", err
		}
		return "", untouched{err}
	}
	j.Enter(ctx, stackbuild.BuildChecking)
	if p.What != "" {
		j.Logf(ctx, "updating stack %s: %s", st.ID, p.What)
	} else {
		j.Logf(ctx, "updating stack %s from revision %d to %d", st.ID, st.TemplateRev, p.Rev)
	}
	releaseQuota, err := s.holdQuota(ctx, st.Owner, st.Team) // quota.go: the plan's check and the new records in one step
	if err != nil {
		return failClean(err)
	}
	defer releaseQuota()
	planned, ms, mt, err := s.planUpdate(ctx, c, st, p.Files.V, p.Variables.V, func(line string) { j.Logf(ctx, "%s", line) })
	if err != nil {
		return failClean(err)
	}
	j.Enter(ctx, stackbuild.BuildCredentials)
	// The records first (new machines Building), then the stack's new content naming them all:
	// a stack never points at machines that do not exist.
	if len(mt.added) > 0 {
		if err := s.store.Persist(ctx, "insert machines of stack "+st.ID, 0, func(ctx context.Context) error {
			return s.store.Machines().InsertMany(ctx, mt.added)
		}); err != nil {
			return fail(fmt.Errorf("save new machines: %w", err))
		}
	}
	all := make([]string, 0, len(ms)+len(mt.added))
	for _, m := range ms {
		all = append(all, m.ID)
	}
	for _, m := range mt.added {
		all = append(all, m.ID)
	}
	if err := s.setContent(ctx, st.ID, j.ID, store.StackContent{Files: p.Files.V, Rev: p.Rev, Diverged: p.Diverged, Variables: p.Variables.V, Machines: all}); err != nil {
		return fail(err)
	}
	j.Enter(ctx, stackbuild.BuildUserData)
	agents := agentConfigs{}
	var mint []Machine
	for _, m := range mt.kept {
		if cfg, ok := s.openAgent(m); ok {
			agents[m.ID] = cfg
		} else {
			mint = append(mint, *m)
		}
	}
	mint = append(mint, mt.added...)
	if err := s.mintInto(ctx, st, mint, agents, mt.specs); err != nil {
		return fail(err)
	}
	tpl, err := s.renderFor(ctx, c, st, p.Files.V, p.Variables.V, mt, agents)
	if err != nil {
		return fail(err)
	}
	before := s.stackState(ctx, st.ID)
	changes, err := s.planStack(ctx, j, st, tpl, false)
	if err != nil {
		return fail(err)
	}
	up := s.diffMachines(st, planned, ms, changes, before)
	for _, mc := range up.Machines {
		j.Logf(ctx, "%s", describeChange(mc))
	}
	// Machines Terraform creates again get new keys: the planner must meet their new agents,
	// not the old ones going away. Those kloud had no agent configuration of got new keys
	// above, so their user data changes: they boot new agents too. The planner waits for all
	// of them (Building); their old keys are revoked.
	fresh := map[string]bool{}
	for _, m := range mint {
		fresh[m.ID] = true
	}
	// A kept machine that is neither Running nor Stopped (an earlier update or build failed
	// on it: Unknown) is awaited too, with the key it has: the update converges what a failed
	// one left, and its machines end Running or say why not.
	var again, await []Machine
	revoke := map[string]bool{}
	for _, m := range mt.kept {
		i := slices.IndexFunc(up.Machines, func(mc api.MachineChange) bool { return mc.MachineID == m.ID })
		replaced := i >= 0 && up.Machines[i].Action == api.UpdateReplace
		if replaced && !fresh[m.ID] {
			again = append(again, *m)
		}
		if replaced || fresh[m.ID] {
			revoke[m.ID] = true
		}
		if replaced || fresh[m.ID] || (m.State != provider.Running && m.State != provider.Stopped) {
			await = append(await, *m)
		}
	}
	if len(again) > 0 {
		if err := s.mintInto(ctx, st, again, agents, mt.specs); err != nil {
			return fail(err)
		}
		if tpl, err = s.renderFor(ctx, c, st, p.Files.V, p.Variables.V, mt, agents); err != nil {
			return fail(err)
		}
	}
	for _, m := range await {
		if revoke[m.ID] && m.KiteID != "" { // the key it had before this update
			if err := s.Kontrol.Revoke(context.WithoutCancel(ctx), m.KiteID, "machine replaced by an update of stack "+st.ID); err != nil {
				s.log.WarnContext(ctx, "revoke a replaced machine's key", "kite", m.KiteID, "err", err)
			}
		}
		if !s.setMachine(ctx, m.ID, settledStates(), store.MachineSet{State: new(string(provider.Building)), Reason: new("")}) {
			return fail(fmt.Errorf("machine %s changed state meanwhile; update again", m.Label))
		}
	}
	for _, m := range mt.removed {
		if !s.setMachine(ctx, m.ID, settledStates(), store.MachineSet{State: new(string(provider.Terminating)), Reason: new("")}) {
			return fail(fmt.Errorf("machine %s changed state meanwhile; update again", m.Label))
		}
	}
	j.Enter(ctx, stackbuild.BuildResources)
	tf, err := s.terraformer()
	if err != nil {
		return fail(err)
	}
	tfJob, err := submitTF(ctx, j, func() (string, error) {
		return tf.Apply(ctx, tfapi.Request{ContentID: "stack-" + st.ID, Files: tfFiles(tpl.Files), Variables: tpl.Variables, TraceID: j.ID})
	})
	if err != nil {
		return fail(fmt.Errorf("terraform apply: %w", err))
	}
	s.setStack(ctx, st.ID, store.StackSet{TFJobID: new(tfJob)})
	return tfJob, nil
}

// untouched is an update's error before it changed anything: the stack goes back to the state
// it had (restoreStack) instead of Failed.
type untouched struct{ error }

func (u untouched) Unwrap() error { return u.error }

func (s *Server) restoreStack(ctx context.Context, j *jobCtx, p updateParams, err error) {
	reason := fmt.Sprintf("update to revision %d failed before it changed anything: %v", p.Rev, err)
	if perr := s.store.Persist(ctx, "restore stack "+p.StackID, 0, func(ctx context.Context) error {
		_, err := s.store.Stacks().TransitionOfJob(ctx, p.StackID, []string{StackBuilding}, j.ID, store.StackSet{State: new(p.From), Reason: new(reason)})
		return err
	}); perr != nil {
		s.log.ErrorContext(ctx, "restore stack after a failed update (the reconciler will move it)", "stack", p.StackID, "err", perr)
	}
}

// mintInto mints new agent keys for ms (recording their kite ids and configurations), puts
// their configurations into agents and their kite ids into specs.
func (s *Server) mintInto(ctx context.Context, st *Stack, ms []Machine, agents agentConfigs, specs []*provider.MachineSpec) error {
	if len(ms) == 0 {
		return nil
	}
	cfgs, err := s.mintAgents(ctx, st, ms)
	if err != nil {
		return err
	}
	for i := range ms {
		agents[ms[i].ID] = cfgs[ms[i].ID]
		for _, sp := range specs {
			if sp.ID == ms[i].ID {
				sp.KiteID = ms[i].KiteID
			}
		}
	}
	return nil
}

func (s *Server) setContent(ctx context.Context, stackID, jobID string, c store.StackContent) error {
	var ok bool
	err := s.store.Persist(ctx, "update content of stack "+stackID, 0, func(ctx context.Context) error {
		var err error
		ok, err = s.store.Stacks().SetContent(ctx, stackID, jobID, c)
		return err
	})
	if err != nil {
		return fmt.Errorf("record the stack's new files: %w", err)
	}
	if !ok {
		return fmt.Errorf("stack %s: %w", stackID, stackbuild.ErrNotThisJobs)
	}
	return nil
}

// finishUpdate is the end of a successful terraform apply: removed machines' records go, the
// planner waits for the agents of new and replaced machines (Building), every machine's
// attributes are taken from the state, and the stack is Initialized.
func (s *Server) finishUpdate(ctx context.Context, j *jobCtx, c *Caller, st *Stack, res *tfapi.Result) (stackbuild.StackResult, error) {
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return stackbuild.StackResult{}, s.failUpdate(ctx, st, res, "", fmt.Errorf("load machines: %w", err))
	}
	s.dropRemoved(ctx, st, ms, res)
	var wait, others []Machine
	for _, m := range ms {
		switch m.State {
		case provider.Building:
			wait = append(wait, m)
		case provider.Terminating:
		default:
			others = append(others, m)
		}
	}
	j.Enter(ctx, stackbuild.BuildAgents)
	results := s.flow().WaitAgents(ctx, j, st, wait, res)
	if ctx.Err() != nil {
		return stackbuild.StackResult{}, s.failUpdate(ctx, st, res, "", fmt.Errorf("while waiting for the machines' agents: %w", ctx.Err()))
	}
	j.Enter(ctx, stackbuild.BuildSettings)
	failed := s.flow().SettleMachines(ctx, c, wait, results) // stackbuild, as a build
	for _, m := range others {
		attrs := stackbuild.ResourceValues(res, &m)
		if len(attrs) == 0 {
			continue
		}
		set := store.MachineSet{Attributes: attrs}
		if ip := stackbuild.IPOf(attrs); ip != "" {
			set.IPAddress = new(ip)
		}
		s.setMachine(ctx, m.ID, nil, set)
	}
	if err := s.recordMachineList(ctx, j, st.ID); err != nil {
		return stackbuild.StackResult{}, err
	}
	s.keepPorts(ctx, j, st) // ports.go: a replaced machine gets its recorded rules
	return s.flow().SettleStack(ctx, j, st, failed, fmt.Sprintf("%d of %d new or replaced machines are not ready", len(failed), len(wait)),
		stackbuild.StackResult{StackID: st.ID, Machines: new(len(wait) + len(others)), Awaited: new(len(wait))})
}

// recordMachineList writes the stack's machine list as the records are now.
func (s *Server) recordMachineList(ctx context.Context, j *jobCtx, stackID string) error {
	cur, err := s.loadStack(ctx, nil, stackID)
	if err != nil {
		return err
	}
	ms, err := s.flow().StackMachinesRetry(ctx, stackID)
	if err != nil {
		return err
	}
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return s.setContent(ctx, stackID, j.ID, store.StackContent{Files: cur.Files, Rev: cur.TemplateRev, Diverged: cur.Diverged, Variables: cur.Variables, Machines: ids})
}

// dropRemoved deletes the records (and revokes the keys) of removed machines (Terminating)
// that res, terraform's state after the apply, no longer has. With no state known it does
// nothing: the records stay, and stackbuild's ExitStack makes them Unknown.
func (s *Server) dropRemoved(ctx context.Context, st *Stack, ms []Machine, res *tfapi.Result) {
	if res == nil {
		return
	}
	var ids []string
	for _, m := range ms {
		if m.State != provider.Terminating || stackbuild.StateResource(res, &m) != nil {
			continue
		}
		if m.KiteID != "" {
			if err := s.Kontrol.Revoke(context.WithoutCancel(ctx), m.KiteID, "machine removed by an update of stack "+st.ID); err != nil {
				s.log.WarnContext(ctx, "revoke a removed machine's key", "machine", m.ID, "err", err)
			}
		}
		ids = append(ids, m.ID)
	}
	if err := s.store.Persist(ctx, "delete removed machines of stack "+st.ID, 0, func(ctx context.Context) error {
		return s.store.Machines().DeleteOfStack(ctx, st.ID, ids)
	}); err != nil {
		s.log.ErrorContext(ctx, "delete removed machines", "stack", st.ID, "err", err)
	}
}
