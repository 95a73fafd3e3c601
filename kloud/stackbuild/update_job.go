package stackbuild

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// The stack.update job (update.go has what the calls that start it use).

// RunUpdate runs a stack.update job j with params p (recovering: resumed after a restart) and
// returns its result.
func (f *Flow) RunUpdate(ctx context.Context, j Job, p UpdateParams, recovering bool) (res StackResult, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("internal error: %v", r)
		}
		if err != nil {
			var un untouched
			if errors.As(err, &un) {
				f.restoreStack(ctx, j, p, err)
			}
			f.ExitStack(ctx, j, p.StackID, model.StackBuilding, err)
		}
	}()
	st, c, stop, err := f.Resume(ctx, j, recovering, p.StackID, p.Lease, model.StackBuilding)
	defer stop()
	if err != nil {
		return StackResult{}, err
	}
	tf, err := f.d.Terraformer()
	if err != nil {
		return StackResult{}, err
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
		if err := f.unsettleInterrupted(ctx, st.ID); err != nil {
			return StackResult{}, err
		}
		if st, err = f.stack(ctx, p.StackID); err != nil {
			return StackResult{}, err
		}
		recovering, resumed = false, true
	}
	if !recovering {
		if tfJob, err = f.prepareUpdate(ctx, j, c, st, p, resumed); err != nil {
			return StackResult{}, err
		}
	}
	if ctx.Err() != nil {
		return StackResult{}, f.failUpdate(ctx, st, nil, tfJob, fmt.Errorf("terraform apply: %w", ctx.Err()))
	}
	job, err := tf.Wait(ctx, tfJob, ApplyProgress(ctx, j))
	for reruns := 0; ctx.Err() == nil && reruns < maxReruns && RunDied(waitErr(job, err)); reruns++ {
		// Terraform's run died with its process (terraformer restarted under it, or with a
		// killed kloud): apply converges on the state it left, so the update starts again from
		// what is there, as after a restart before the run was recorded.
		j.Logf(ctx, "terraform's run %s died with its process (%v); updating again", tfJob, waitErr(job, err))
		f.removeStrays(ctx, j, tf, st.ID) // strays.go: what it made and did not record
		if err := f.unsettleInterrupted(ctx, st.ID); err != nil {
			return StackResult{}, err
		}
		if st, err = f.stack(ctx, p.StackID); err != nil {
			return StackResult{}, err
		}
		if tfJob, err = f.prepareUpdate(ctx, j, c, st, p, true); err != nil {
			return StackResult{}, err
		}
		job, err = tf.Wait(ctx, tfJob, ApplyProgress(ctx, j))
	}
	if err != nil {
		return StackResult{}, f.failUpdate(ctx, st, nil, tfJob, fmt.Errorf("terraform apply: %w", err))
	}
	if err := job.Err(); err != nil {
		return StackResult{}, f.failUpdate(ctx, st, job.Result, tfJob, fmt.Errorf("terraform apply: %w", err))
	}
	return f.finishUpdate(ctx, j, c, st, job.Result)
}

// failUpdate stops terraform's run if the job was cancelled, drops the removed machines
// terraform did remove, and returns reason; ExitStack then moves the stack to Failed and the
// machines still Building or Terminating to Unknown.
func (f *Flow) failUpdate(ctx context.Context, st *model.Stack, res *tfapi.Result, tfJob string, reason error) error {
	if ctx.Err() != nil {
		reason = fmt.Errorf("update cancelled: %w", reason)
	}
	f.StopTF(ctx, tfJob)
	if ms, err := f.StackMachinesRetry(ctx, st.ID); err == nil {
		f.dropRemoved(ctx, st, ms, res)
	}
	return reason
}

// unsettleInterrupted moves the machines of stack id an interrupted update attempt left Building
// or Terminating to Unknown, so the next attempt can plan them.
func (f *Flow) unsettleInterrupted(ctx context.Context, id string) error {
	ms, err := f.StackMachinesRetry(ctx, id)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.State == provider.Building || m.State == provider.Terminating {
			f.SetMachine(ctx, m.ID, []provider.State{m.State}, store.MachineSet{State: new(string(provider.Unknown)), Reason: new("an update was interrupted (kloud restarted)")})
		}
	}
	return nil
}

// prepareUpdate plans the update, writes the new files and machine records, mints the keys of
// new and replaced machines, and submits terraform apply. It returns terraform's run. resumed:
// an earlier attempt of the job may have written files and records already.
func (f *Flow) prepareUpdate(ctx context.Context, j Job, c Caller, st *model.Stack, p UpdateParams, resumed bool) (string, error) {
	fail := func(err error) (string, error) { return "", err }
	failClean := func(err error) (string, error) { // nothing written yet
		if resumed {
			return "", err
		}
		return "", untouched{err}
	}
	j.Enter(ctx, BuildChecking)
	if p.What != "" {
		j.Logf(ctx, "updating stack %s: %s", st.ID, p.What)
	} else {
		j.Logf(ctx, "updating stack %s from revision %d to %d", st.ID, st.TemplateRev, p.Rev)
	}
	releaseQuota, err := f.d.Quota.Hold(ctx, st.Owner, st.Team) // the plan's check and the new records in one step
	if err != nil {
		return failClean(err)
	}
	defer releaseQuota()
	planned, ms, mt, err := f.planUpdate(ctx, c, st, p.Files.V, p.Variables.V, func(line string) { j.Logf(ctx, "%s", line) })
	if err != nil {
		return failClean(err)
	}
	j.Enter(ctx, BuildCredentials)
	// The records first (new machines Building), then the stack's new content naming them all:
	// a stack never points at machines that do not exist.
	if len(mt.added) > 0 {
		if err := f.d.Store.Persist(ctx, "insert machines of stack "+st.ID, 0, func(ctx context.Context) error {
			return f.d.Store.Machines().InsertMany(ctx, mt.added)
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
	if err := f.setContent(ctx, st.ID, j.Doc().ID, store.StackContent{Files: p.Files.V, Rev: p.Rev, Diverged: p.Diverged, Variables: p.Variables.V, Machines: all}); err != nil {
		return fail(err)
	}
	j.Enter(ctx, BuildUserData)
	agents := AgentConfigs{}
	var mint []model.Machine
	for _, m := range mt.kept {
		if cfg, ok := f.OpenAgent(m); ok {
			agents[m.ID] = cfg
		} else {
			mint = append(mint, *m)
		}
	}
	mint = append(mint, mt.added...)
	if err := f.mintInto(ctx, st, mint, agents, mt.specs); err != nil {
		return fail(err)
	}
	tpl, buckets, err := f.renderFor(ctx, c, st, p.Files.V, p.Variables.V, mt, agents)
	if err != nil {
		return fail(err)
	}
	before := f.stackState(ctx, st.ID)
	changes, err := f.planStack(ctx, j, st, tpl, false)
	if err != nil {
		return fail(err)
	}
	up := f.diffMachines(st, planned, ms, changes, before)
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
	var again, await []model.Machine
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
		if err := f.mintInto(ctx, st, again, agents, mt.specs); err != nil {
			return fail(err)
		}
		if tpl, _, err = f.renderFor(ctx, c, st, p.Files.V, p.Variables.V, mt, agents); err != nil {
			return fail(err)
		}
	}
	for _, m := range await {
		if revoke[m.ID] && m.KiteID != "" { // the key it had before this update
			if err := f.d.Kontrol.Revoke(context.WithoutCancel(ctx), m.KiteID, "machine replaced by an update of stack "+st.ID); err != nil {
				f.log.WarnContext(ctx, "revoke a replaced machine's key", "kite", m.KiteID, "err", err)
			}
		}
		if !f.SetMachine(ctx, m.ID, SettledStates(), store.MachineSet{State: new(string(provider.Building)), Reason: new("")}) {
			return fail(fmt.Errorf("machine %s changed state meanwhile; update again", m.Label))
		}
	}
	for _, m := range mt.removed {
		if !f.SetMachine(ctx, m.ID, SettledStates(), store.MachineSet{State: new(string(provider.Terminating)), Reason: new("")}) {
			return fail(fmt.Errorf("machine %s changed state meanwhile; update again", m.Label))
		}
	}
	if err := f.ProvisionBuckets(ctx, j, st, buckets); err != nil {
		return fail(err)
	}
	j.Enter(ctx, BuildResources)
	tf, err := f.d.Terraformer()
	if err != nil {
		return fail(err)
	}
	tfJob, err := SubmitTF(ctx, j, func() (string, error) {
		return tf.Apply(ctx, tfapi.Request{ContentID: "stack-" + st.ID, Files: tfapi.Files(tpl.Files), Variables: tpl.Variables, TraceID: j.Doc().ID})
	})
	if err != nil {
		return fail(fmt.Errorf("terraform apply: %w", err))
	}
	f.SetStack(ctx, st.ID, store.StackSet{TFJobID: new(tfJob)})
	return tfJob, nil
}

// untouched is an update's error before it changed anything: the stack goes back to the state
// it had (restoreStack) instead of Failed.
type untouched struct{ error }

func (u untouched) Unwrap() error { return u.error }

func (f *Flow) restoreStack(ctx context.Context, j Job, p UpdateParams, err error) {
	reason := fmt.Sprintf("update to revision %d failed before it changed anything: %v", p.Rev, err)
	if perr := f.d.Store.Persist(ctx, "restore stack "+p.StackID, 0, func(ctx context.Context) error {
		_, err := f.d.Store.Stacks().TransitionOfJob(ctx, p.StackID, []string{model.StackBuilding}, j.Doc().ID, store.StackSet{State: new(p.From), Reason: new(reason)})
		return err
	}); perr != nil {
		f.log.ErrorContext(ctx, "restore stack after a failed update (the reconciler will move it)", "stack", p.StackID, "err", perr)
	}
}

// mintInto mints new agent keys for ms (recording their kite ids and configurations), puts
// their configurations into agents and their kite ids into specs.
func (f *Flow) mintInto(ctx context.Context, st *model.Stack, ms []model.Machine, agents AgentConfigs, specs []*provider.MachineSpec) error {
	if len(ms) == 0 {
		return nil
	}
	cfgs, err := f.Mint(ctx, st, ms)
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

func (f *Flow) setContent(ctx context.Context, stackID, jobID string, c store.StackContent) error {
	var ok bool
	err := f.d.Store.Persist(ctx, "update content of stack "+stackID, 0, func(ctx context.Context) error {
		var err error
		ok, err = f.d.Store.Stacks().SetContent(ctx, stackID, jobID, c)
		return err
	})
	if err != nil {
		return fmt.Errorf("record the stack's new files: %w", err)
	}
	if !ok {
		return fmt.Errorf("stack %s: %w", stackID, ErrNotThisJobs)
	}
	return nil
}

// finishUpdate is the end of a successful terraform apply: removed machines' records go, the
// planner waits for the agents of new and replaced machines (Building), every machine's
// attributes are taken from the state, and the stack is Initialized.
func (f *Flow) finishUpdate(ctx context.Context, j Job, c Caller, st *model.Stack, res *tfapi.Result) (StackResult, error) {
	ms, err := f.StackMachinesRetry(ctx, st.ID)
	if err != nil {
		return StackResult{}, f.failUpdate(ctx, st, res, "", fmt.Errorf("load machines: %w", err))
	}
	f.dropRemoved(ctx, st, ms, res)
	var wait, others []model.Machine
	for _, m := range ms {
		switch m.State {
		case provider.Building:
			wait = append(wait, m)
		case provider.Terminating:
		default:
			others = append(others, m)
		}
	}
	j.Enter(ctx, BuildAgents)
	results := f.WaitAgents(ctx, j, st, wait, res)
	if ctx.Err() != nil {
		return StackResult{}, f.failUpdate(ctx, st, res, "", fmt.Errorf("while waiting for the machines' agents: %w", ctx.Err()))
	}
	j.Enter(ctx, BuildSettings)
	failed := f.SettleMachines(ctx, c, wait, results) // as a build
	for _, m := range others {
		attrs := ResourceValues(res, &m)
		if len(attrs) == 0 {
			continue
		}
		set := store.MachineSet{Attributes: attrs}
		if ip := IPOf(attrs); ip != "" {
			set.IPAddress = new(ip)
		}
		f.SetMachine(ctx, m.ID, nil, set)
	}
	if err := f.recordMachineList(ctx, j, st.ID); err != nil {
		return StackResult{}, err
	}
	f.d.Machines.KeepPorts(ctx, j, st)      // ports.go: a replaced machine gets its recorded rules
	f.d.Machines.DeliverBuckets(ctx, j, st) // kloud/buckets.go: the agents get the stack's buckets
	return f.SettleStack(ctx, j, st, failed, fmt.Sprintf("%d of %d new or replaced machines are not ready", len(failed), len(wait)),
		StackResult{StackID: st.ID, Machines: new(len(wait) + len(others)), Awaited: new(len(wait))})
}

// recordMachineList writes the stack's machine list as the records are now.
func (f *Flow) recordMachineList(ctx context.Context, j Job, stackID string) error {
	cur, err := f.stack(ctx, stackID)
	if err != nil {
		return err
	}
	ms, err := f.StackMachinesRetry(ctx, stackID)
	if err != nil {
		return err
	}
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return f.setContent(ctx, stackID, j.Doc().ID, store.StackContent{Files: cur.Files, Rev: cur.TemplateRev, Diverged: cur.Diverged, Variables: cur.Variables, Machines: ids})
}

// dropRemoved deletes the records (and revokes the keys) of removed machines (Terminating)
// that res, terraform's state after the apply, no longer has. With no state known it does
// nothing: the records stay, and ExitStack makes them Unknown.
func (f *Flow) dropRemoved(ctx context.Context, st *model.Stack, ms []model.Machine, res *tfapi.Result) {
	if res == nil {
		return
	}
	var ids []string
	for _, m := range ms {
		if m.State != provider.Terminating || StateResource(res, &m) != nil {
			continue
		}
		if m.KiteID != "" {
			if err := f.d.Kontrol.Revoke(context.WithoutCancel(ctx), m.KiteID, "machine removed by an update of stack "+st.ID); err != nil {
				f.log.WarnContext(ctx, "revoke a removed machine's key", "machine", m.ID, "err", err)
			}
		}
		ids = append(ids, m.ID)
	}
	if err := f.d.Store.Persist(ctx, "delete removed machines of stack "+st.ID, 0, func(ctx context.Context) error {
		return f.d.Store.Machines().DeleteOfStack(ctx, st.ID, ids)
	}); err != nil {
		f.log.ErrorContext(ctx, "delete removed machines", "stack", st.ID, "err", err)
	}
}

// waitErr is how a terraform run that Wait returned (job, err) ended: err, or the run's error.
func waitErr(job *tfapi.Job, err error) error {
	if err != nil || job == nil {
		return err
	}
	return job.Err()
}
