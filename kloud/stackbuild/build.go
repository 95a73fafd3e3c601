package stackbuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/userdata"
)

// RunApply runs a stack.apply job j with params (a build, or a destroy; recovering: resumed
// after a restart) and returns its result.
func (f *Flow) RunApply(ctx context.Context, j Job, params ApplyParams, recovering bool) (res StackResult, err error) {
	stackID, destroy, owner := params.StackID, params.Destroy, params.Lease
	during := model.StackBuilding
	if destroy {
		during = model.StackDestroying
	}
	// No state without an exit: however this job ends (an error anywhere, a cancel, a panic),
	// a stack still in this job's transitional state is moved to Failed, and its machines out
	// of theirs, before the job is finished.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("internal error: %v", p)
		}
		if err != nil {
			f.ExitStack(ctx, j, stackID, during, err)
		}
	}()
	st, c, stop, err := f.Resume(ctx, j, recovering, stackID, owner, during)
	defer stop()
	if err != nil && destroy && recovering && errors.Is(err, kite.ErrNotFound) {
		// A destroy's last step deletes the stack's record: kloud stopped after it and before
		// the job's end was written (chaos: a SIGKILL there failed the resumed job "stack …:
		// not found"). The stack is destroyed; so is the job's work.
		j.Logf(ctx, "the stack is gone: its destroy had finished when kloud stopped")
		return StackResult{StackID: stackID, Destroyed: true}, nil
	}
	if err != nil {
		return StackResult{}, err
	}
	if destroy {
		return f.Destroy(ctx, j, st)
	}
	return f.build(ctx, j, c, st, recovering)
}

// Resume is the start of stack job j's run (of stack stackID, holding lease, the stack
// during in its transitional state): a job resumed after a restart (recovering) takes its lease
// again, unless it was cancelled meanwhile; the lease is renewed until stop (never nil: defer
// it at once); the stack must still be the job's (ErrNotThisJobs); the job runs as its owner c.
func (f *Flow) Resume(ctx context.Context, j Job, recovering bool, stackID, lease, during string) (st *model.Stack, c Caller, stop func(), err error) {
	stop = func() {}
	if recovering {
		if j.Doc().CancelRequested {
			return nil, nil, stop, fmt.Errorf("cancelled while no kloud ran it: %w", store.ErrJobCancelled)
		}
		// The lease may still be ours (same owner) or have expired: take it again either way.
		// Someone may hold it for a moment (a stack.apply or stack.reset that looks, finds this
		// job live, and lets go): try for a while.
		if err := f.RetakeLease(ctx, "stack/"+stackID, lease); err != nil {
			return nil, nil, stop, fmt.Errorf("stack %s: %w", stackID, err)
		}
		j.Logf(ctx, "kloud restarted during this job; resuming")
	}
	stop = f.KeepLease(context.Background(), "stack/"+stackID, lease)
	if st, err = f.stack(ctx, stackID); err != nil {
		return nil, nil, stop, err
	}
	if st.State != during || st.JobID != j.Doc().ID {
		// Reconciled or reset while this job was not running (e.g. recovered after a long
		// outage): the stack is no longer this job's.
		return nil, nil, stop, fmt.Errorf("stack %s is %s (job %q): %w", st.ID, st.State, st.JobID, ErrNotThisJobs)
	}
	if c, err = f.d.Callers.Caller(ctx, j.Doc().Owner); err != nil {
		return nil, nil, stop, err
	}
	return st, c, stop, nil
}

// ErrNotThisJobs: a job found its target reconciled or reset while it was not running.
var ErrNotThisJobs = fmt.Errorf("no longer in this job's hands (reconciled or reset meanwhile): %w", kite.ErrState)

// ExitStack is the last resort of a stack job that returned an error: if the stack is still in
// the job's transitional state (the job's own failure bookkeeping did not land), it moves it to
// Failed, and its machines in Building or Terminating to Unknown, with the job's error as the
// reason. Each change is conditional on the stack still belonging to the job.
func (f *Flow) ExitStack(ctx context.Context, j Job, stackID, during string, jobErr error) {
	if errors.Is(jobErr, ErrNotThisJobs) {
		return
	}
	reason := jobErr.Error()
	if ctx.Err() != nil && !strings.Contains(reason, "cancelled") {
		reason = "cancelled: " + reason
	}
	var moved bool
	err := f.d.Store.Persist(ctx, "fail stack "+stackID, 0, func(ctx context.Context) error {
		ok, err := f.d.Store.Stacks().TransitionOfJob(ctx, stackID, []string{during}, j.Doc().ID,
			store.StackSet{State: new(model.StackFailed), Reason: new(reason)})
		moved = ok
		return err
	})
	if err != nil {
		f.log.ErrorContext(ctx, "fail stack (the reconciler will)", "stack", stackID, "job", j.Doc().ID, "err", err)
		return
	}
	if moved {
		f.log.WarnContext(ctx, "stack job ended without its bookkeeping; stack moved to Failed", "stack", stackID, "job", j.Doc().ID, "reason", reason)
	}
	ms, err := f.StackMachinesRetry(ctx, stackID)
	if err != nil {
		f.log.ErrorContext(ctx, "load machines of a failed stack (the reconciler will fix their states)", "stack", stackID, "err", err)
		return
	}
	for _, m := range ms {
		if ms := m.State; ms == provider.Building || ms == provider.Terminating {
			f.SetMachine(ctx, m.ID, []provider.State{ms}, store.MachineSet{State: new(string(provider.Unknown)), Reason: new(reason)})
		}
	}
}

// failBuild puts the stack and its machines back into an honest state after a failed build:
// the stack Failed; machines back to the state they had before the build (ms is read before
// they were set Building) if terraform never ran in this attempt, else Unknown (terraform may
// have made them: machine.info asks the provider, and the stack can be built again or
// destroyed). If ctx was cancelled, a terraform run still going is stopped first.
func (f *Flow) failBuild(ctx context.Context, st *model.Stack, ms []model.Machine, reason error) error {
	return f.failBuildState(ctx, st, ms, false, "", nil, reason)
}

// failBuildTF is failBuild once terraform may have run (tfJob: its run, if known).
func (f *Flow) failBuildTF(ctx context.Context, st *model.Stack, ms []model.Machine, tfJob string, reason error) error {
	return f.failBuildState(ctx, st, ms, true, tfJob, nil, reason)
}

// failBuildState is failBuild with whether terraform ran and the state the failed run left
// (res, nil if none): a machine the run made is recorded with its attributes (its id, its
// address) in the same update, so the store agrees with the state (TestChaos: a provider plugin
// killed during a boot provisioner left a machine in the state that the store did not know),
// machine.info can ask its provider, and a destroy or a new build starts from it.
func (f *Flow) failBuildState(ctx context.Context, st *model.Stack, ms []model.Machine, tfRan bool, tfJob string, res *tfapi.Result, reason error) error {
	if ctx.Err() != nil {
		reason = fmt.Errorf("build cancelled: %w", reason)
	}
	f.StopTF(ctx, tfJob)
	for _, m := range ms {
		back := m.State
		if tfRan || back.InProgress() {
			back = provider.Unknown
		}
		set := store.MachineSet{State: new(string(back)), Reason: new(reason.Error())}
		if StateResource(res, &m) != nil {
			set.Attributes = ResourceValues(res, &m)
			if ip := IPOf(set.Attributes); ip != "" {
				set.IPAddress = new(ip)
			}
		}
		f.SetMachine(ctx, m.ID, []provider.State{provider.Building}, set)
	}
	f.SetStack(ctx, st.ID, store.StackSet{State: new(model.StackFailed), Reason: new(reason.Error())})
	return reason
}

// build is a stack.apply job j building st as c (recovering: resumed after a restart, which
// waits for terraform's recorded run rather than starting one).
func (f *Flow) build(ctx context.Context, j Job, c Caller, st *model.Stack, recovering bool) (StackResult, error) {
	return f.buildAttempt(ctx, j, c, st, recovering, 0)
}

// buildAttempt is build; reruns counts the terraform runs of this job that died with their
// process (RunDied) and were started again.
func (f *Flow) buildAttempt(ctx context.Context, j Job, c Caller, st *model.Stack, recovering bool, reruns int) (StackResult, error) {
	ms, err := f.StackMachines(ctx, st.ID)
	if err != nil {
		return StackResult{}, err
	}
	tf, err := f.d.Terraformer()
	if err != nil {
		return StackResult{}, f.failBuild(ctx, st, ms, err)
	}
	tfJob := ""
	if recovering {
		var cur model.Stack
		// A read that fails must not look like "no run recorded" (that builds again).
		if err := f.d.Store.Persist(ctx, "read stack "+st.ID, 0, func(ctx context.Context) error {
			var err error
			cur, err = f.d.Store.Stacks().Get(ctx, st.ID)
			return err
		}); err != nil {
			return StackResult{}, f.failBuildTF(ctx, st, ms, "", fmt.Errorf("read the recorded terraform run: %w", err))
		}
		tfJob = cur.TFJobID
		if tfJob == "" {
			// Killed before terraform's run was recorded: it may not have started, or may be
			// running still. Build again from the start; terraformer's lease makes the new run
			// wait for an old one, and terraform converges on what it left.
			j.Logf(ctx, "kloud restarted before terraform's run was recorded; building again")
			if ms, err = f.unbuild(ctx, st.ID, ms); err != nil {
				return StackResult{}, err
			}
			recovering = false
		}
	}
	if !recovering {
		j.Enter(ctx, BuildChecking)
		// A stack builds from NotInitialized or Failed: its machines may be in any settled
		// state (a failed or cancelled build leaves them Unknown); terraform converges on the
		// template. A machine in a transition has a job of its own at work.
		for _, m := range ms {
			if m.State.InProgress() {
				return StackResult{}, f.failBuild(ctx, st, nil, fmt.Errorf("machine %s is %s (a job is changing it); build again when it is done", m.Label, m.State))
			}
		}
		for i, m := range ms {
			if !f.SetMachine(ctx, m.ID, SettledStates(), store.MachineSet{State: new(string(provider.Building)), Reason: new("")}) {
				return StackResult{}, f.failBuild(ctx, st, ms[:i], fmt.Errorf("machine %s changed state meanwhile", m.Label))
			}
		}
		j.Enter(ctx, BuildCredentials)
		vars, err := f.Variables(st, st.Variables)
		if err != nil {
			return StackResult{}, f.failBuild(ctx, st, ms, err)
		}
		b, err := f.d.Templates.Template(ctx, c, st.Team, FileMap(st.Files), st.Credentials, vars)
		if err != nil {
			return StackResult{}, f.failBuild(ctx, st, ms, err)
		}
		j.Enter(ctx, BuildUserData)
		// Every agent's configuration first (keys minted, kite ids recorded); the providers'
		// rewrite below only renders them into the template and writes nothing.
		agents, err := f.Mint(ctx, st, ms)
		if err != nil {
			return StackResult{}, f.failBuild(ctx, st, ms, err)
		}
		tpl := &provider.Template{Files: b.Files, Variables: b.Variables, Config: b.Config}
		for _, name := range slices.Sorted(maps.Keys(b.Providers)) {
			p, _ := f.d.Providers.Lookup(name)
			bs := &provider.BaseStack{Provider: p, StackID: st.ID, Team: st.Team, Owner: st.Owner, Template: tpl, Log: f.log.With("stack", st.ID, "provider", name),
				AgentConfig: agents.Config}
			for i := range ms {
				if ms[i].Provider == name {
					bs.Machines = append(bs.Machines, MachineSpec(&ms[i]))
				}
			}
			stack, err := p.Stack(bs)
			if err != nil {
				return StackResult{}, f.failBuild(ctx, st, ms, fmt.Errorf("provider %s: %w", name, err))
			}
			if tpl, err = stack.ApplyTemplate(ctx, b.Creds[name]); err != nil {
				return StackResult{}, f.failBuild(ctx, st, ms, fmt.Errorf("provider %s: %w", name, err))
			}
			bs.Template = tpl
		}
		releaseQuota, err := f.d.Quota.Hold(ctx, st.Owner, st.Team) // the bucket quota's check and the claims it allows in one step
		if err != nil {
			return StackResult{}, f.failBuild(ctx, st, ms, err)
		}
		err = f.ProvisionBuckets(ctx, j, st, b.Buckets)
		releaseQuota()
		if err != nil {
			return StackResult{}, f.failBuild(ctx, st, ms, err)
		}
		j.Enter(ctx, BuildResources)
		tfJob, err = SubmitTF(ctx, j, func() (string, error) {
			return tf.Apply(ctx, tfapi.Request{ContentID: "stack-" + st.ID, Files: tfapi.Files(tpl.Files), Variables: tpl.Variables, TraceID: j.Doc().ID})
		})
		if err != nil {
			return StackResult{}, f.failBuild(ctx, st, ms, fmt.Errorf("terraform apply: %w", err))
		}
		f.SetStack(ctx, st.ID, store.StackSet{TFJobID: new(tfJob)})
	}
	if ctx.Err() != nil {
		return StackResult{}, f.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("terraform apply: %w", ctx.Err()))
	}
	job, err := tf.Wait(ctx, tfJob, ApplyProgress(ctx, j))
	err = waitErr(job, err)
	if err != nil && RunDied(err) && ctx.Err() == nil && reruns < maxReruns {
		// Apply converges on the state the dead run left: run it again, from the start (the
		// template and the agents' keys are made again too).
		j.Logf(ctx, "terraform's run %s died with its process (%v); running it again", tfJob, err)
		f.removeStrays(ctx, j, tf, st.ID) // strays.go: what it made and did not record
		if _, err := f.unbuild(ctx, st.ID, ms); err != nil {
			return StackResult{}, f.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("terraform apply: %w", err))
		}
		return f.buildAttempt(ctx, j, c, st, false, reruns+1)
	}
	if err != nil {
		var left *tfapi.Result // what the failed run made, as its state says
		if job != nil {
			left = job.Result
		}
		return StackResult{}, f.failBuildState(ctx, st, ms, true, tfJob, left, fmt.Errorf("terraform apply: %w", err))
	}
	ms, err = f.StackMachinesRetry(ctx, st.ID) // as recorded (kite ids by Mint, also of an attempt before a restart)
	if err != nil {
		return StackResult{}, f.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("load machines: %w", err))
	}
	j.Enter(ctx, BuildAgents)
	results := f.WaitAgents(ctx, j, st, ms, job.Result)
	if ctx.Err() != nil {
		return StackResult{}, f.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("while waiting for the machines' agents: %w", ctx.Err()))
	}
	j.Enter(ctx, BuildSettings)
	failed := f.SettleMachines(ctx, c, ms, results)
	f.d.Machines.KeepPorts(ctx, j, st)      // ports.go: a machine built again gets its recorded rules
	f.d.Machines.DeliverBuckets(ctx, j, st) // kloud/buckets.go: the agents get the stack's buckets
	return f.SettleStack(ctx, j, st, failed, fmt.Sprintf("%d of %d machines are not ready", len(failed), len(ms)),
		StackResult{StackID: st.ID, Machines: new(len(ms))})
}

// unbuild moves the stack's machines ms that are Building back to NotInitialized, before its
// build starts again from the start, and returns them as recorded then.
func (f *Flow) unbuild(ctx context.Context, stackID string, ms []model.Machine) ([]model.Machine, error) {
	for _, m := range ms {
		f.SetMachine(ctx, m.ID, []provider.State{provider.Building}, store.MachineSet{State: new(string(provider.NotInitialized))})
	}
	return f.StackMachinesRetry(ctx, stackID)
}

// SettleMachines records how each machine a build or an update waited for ended (ms and
// results of WaitAgents, in the same order; WaitAgents filled the attributes from the state):
// Running with its agent connected, or, when the agent did not come, the state its provider
// reports (Unknown if it cannot tell) with the failure as the reason. Only machines still
// Building change. It returns the failures.
func (f *Flow) SettleMachines(ctx context.Context, c Caller, ms []model.Machine, results []AgentResult) []string {
	var failed []string
	for i, m := range ms {
		r := results[i]
		set := store.MachineSet{Attributes: m.Attributes, Reason: new("")}
		if ip := IPOf(m.Attributes); ip != "" {
			set.IPAddress = new(ip)
		}
		state := provider.Running
		if !r.OK {
			failed = append(failed, r.Err.Error())
			set.Reason = new(fmt.Sprintf("%s failed: %s", r.Step, r.Err.Error()))
			state = provider.Unknown
			if pm, err := f.d.Machines.ProviderMachine(ctx, c, &m); err == nil && f.d.Machines.CanInfo(m.Provider) {
				if infra, _, err := pm.Info(ctx); err == nil && infra != provider.Unknown {
					state = infra
				}
			}
		} else {
			version := ""
			if r.Info != nil {
				version = r.Info.Version
				if r.Info.SSHHostKey != "" { // kloud/relay ssh.go: what config-ssh pins
					set.SSHHostKey = new(r.Info.SSHHostKey)
				}
			}
			f.d.Machines.SetAgent(ctx, m.KiteID, model.AgentConnected, version)
		}
		set.State = new(string(state))
		f.SetMachine(ctx, m.ID, []provider.State{provider.Building}, set)
	}
	return failed
}

// ApplyProgress follows a terraform apply of a build or an update in job j: the resources' stage
// and percentage, each resource's message once (progress repeats it), terraform's diagnostics.
func ApplyProgress(ctx context.Context, j Job) func(tfapi.Event) {
	said := map[string]string{} // the last message logged per resource
	return func(ev tfapi.Event) {
		if ev.Type == tfapi.EventProgress && ev.Resource != nil {
			j.EnterAt(ctx, BuildResources, ev.Percent)
			if msg := ev.Resource.Message; msg != "" && said[ev.Resource.Address] != msg {
				said[ev.Resource.Address] = msg
				j.Logf(ctx, "%s", msg)
			}
		}
		if ev.Type == tfapi.EventDiagnostic && ev.Diagnostic != nil {
			j.Logf(ctx, "terraform: %s", ev.Diagnostic.String())
		}
	}
}

// SettleStack ends a build or an update whose machines are settled: the stack is Initialized,
// with reason if some machines failed (the job then fails with their failures), and the job
// returns res.
func (f *Flow) SettleStack(ctx context.Context, j Job, st *model.Stack, failed []string, reason string, res StackResult) (StackResult, error) {
	if len(failed) > 0 {
		f.SetStack(ctx, st.ID, store.StackSet{State: new(model.StackInitialized), Reason: new(reason)})
		return StackResult{StackID: st.ID}, fmt.Errorf("%s:\n%s", reason, strings.Join(failed, "\n"))
	}
	f.SetStack(ctx, st.ID, store.StackSet{State: new(model.StackInitialized), Reason: new("")})
	j.Enter(ctx, BuildDone)
	return res, nil
}

// WaitAgents waits for the agents of ms (their attributes filled from terraform's result res)
// with the planner, logging each on job j, and returns one result per machine, in order.
func (f *Flow) WaitAgents(ctx context.Context, j Job, st *model.Stack, ms []model.Machine, res *tfapi.Result) []AgentResult {
	pl := f.d.Planner()
	c, _ := f.d.Callers.Caller(ctx, st.Owner)
	var ex []Expect
	for i := range ms {
		m := &ms[i]
		m.Attributes = ResourceValues(res, m)
		e := Expect{Label: m.Label, KiteID: m.KiteID, Provider: f.providerOf(m.Provider)}
		if pm, err := f.d.Machines.ProviderMachine(ctx, c, m); err == nil {
			e.Machine = pm
		}
		ex = append(ex, e)
	}
	return pl.Wait(ctx, ex, func(r AgentResult) {
		if r.OK {
			j.Logf(ctx, "%s: agent connected", r.Label)
		} else {
			j.Logf(ctx, "%s: %s failed: %v", r.Label, r.Step, r.Err)
		}
	})
}

// ResourceValues returns the state values of m's resource instance.
func ResourceValues(res *tfapi.Result, m *model.Machine) map[string]any {
	r := StateResource(res, m)
	if r == nil || r.Values == nil {
		return map[string]any{}
	}
	return VisibleAttrs(r.Values) // not the agent's kite key (user data and the like)
}

// StateResource is m's resource instance in terraform's state res (nil if it has none).
func StateResource(res *tfapi.Result, m *model.Machine) *tfapi.StateResource {
	if res == nil {
		return nil
	}
	for i, r := range res.Resources {
		if r.Mode != "managed" || r.Name != m.Resource || r.Module != "" {
			continue
		}
		n, has := Index(r.Index)
		if (m.Index == nil && !has) || (m.Index != nil && has && *m.Index == n) {
			return &res.Resources[i]
		}
	}
	return nil
}

// IPOf is a machine's IP address among its resource's attributes ("" if none).
func IPOf(attrs map[string]any) string {
	for _, k := range []string{"ip_address", "ipv4_address", "private_ip", "public_ip"} {
		if v, ok := attrs[k].(string); ok && v != "" {
			return v
		}
	}
	// docker_container: network_data = [{network_name, ip_address, ...}].
	if nd, ok := attrs["network_data"].([]any); ok {
		for _, n := range nd {
			if n, ok := n.(map[string]any); ok {
				if v, ok := n["ip_address"].(string); ok && v != "" {
					return v
				}
			}
		}
	}
	return ""
}

// MachineSpec is m as the provider contract describes it.
func MachineSpec(m *model.Machine) *provider.MachineSpec {
	return &provider.MachineSpec{ID: m.ID, Label: m.Label, Resource: m.Resource, Index: m.Index, Provider: m.Provider,
		KiteID: m.KiteID, Owner: m.Owner, Attributes: m.Attributes}
}

// AgentConfigs are the machines' agent configurations by machine id (Mint).
type AgentConfigs map[string]userdata.Config

// Config is provider.BaseStack.AgentConfig: a lookup, nothing minted or written.
func (a AgentConfigs) Config(_ context.Context, m *provider.MachineSpec) (userdata.Config, error) {
	c, ok := a[m.ID]
	if !ok {
		return userdata.Config{}, fmt.Errorf("machine %s has no agent configuration", m.Label)
	}
	return c, nil
}

// Index is a terraform resource instance's count index, if v is one.
func Index(v any) (int, bool) {
	switch x := v.(type) {
	case float64:
		return int(x), true
	case int:
		return x, true
	case int64:
		return int(x), true
	}
	return 0, false
}

// HiddenAttr: attributes that hold an agent's key (user data, the dummy's input and output,
// the docker provider's NoCloud seed upload) are never shown or stored, only named.
func HiddenAttr(k string) bool {
	return strings.Contains(k, "user_data") || k == "input" || k == "output" || k == "upload"
}

// VisibleAttrs is a without its hidden attributes (HiddenAttr).
func VisibleAttrs(a map[string]any) map[string]any {
	if a == nil {
		return nil
	}
	out := make(map[string]any, len(a))
	for k, v := range a {
		if !HiddenAttr(k) {
			out[k] = v
		}
	}
	return out
}
