package kloud

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/google/uuid"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/userdata"
)

// Stacks: stack.plan (what a template would make), stack.create (machine documents), stack.apply
// (build or destroy, a durable job), stack.describe and stack.list.

const jobStackApply = stackbuild.JobApply

// builtTemplate is a template ready for Terraform: files, variables, credentials.
type builtTemplate struct {
	files     map[string][]byte
	cfg       *tmpl.Config // files parsed: the one parse of a build, handed on to the providers
	variables map[string]any
	creds     map[string]*provider.Credential // provider → credential
	credIDs   map[string]string
	providers map[string][]string // provider → machine resource names
	team      string              // whose template and credentials
	// maxMachines is the cap on planned machines and capHow how to change it (capBuild,
	// limits.go; 0: kloud's global cap).
	maxMachines int
	capHow      string
}

// build resolves credentials and variables for files and checks that secrets reach only
// provider blocks. Providers also are configured too (credentials resolved) though the files
// declare no machines of theirs: an update that removes all of a provider's machines.
func (s *Server) build(ctx context.Context, c *Caller, team string, files map[string][]byte, credIDs, vars map[string]string, also ...string) (*builtTemplate, error) {
	cfg, res, err := s.machineResources(files)
	if err != nil {
		return nil, err
	}
	// The template policy again (kloud/policy.go): a template stored before it, or bypassing
	// template.create, does not run.
	if err := s.checkPolicyParsed(ctx, team, files, cfg); err != nil {
		return nil, err
	}
	b := &builtTemplate{files: files, variables: map[string]any{}, creds: map[string]*provider.Credential{}, credIDs: map[string]string{}, providers: map[string][]string{},
		team: team}
	for k, v := range vars {
		b.variables[k] = v
	}
	for name, rs := range res {
		for _, r := range rs {
			b.providers[name] = append(b.providers[name], r.Name)
		}
	}
	needed := map[string]bool{}
	for name := range res {
		needed[name] = true
	}
	for _, name := range slices.Concat(cfg.Providers(), also) {
		if _, err := s.providers.Lookup(name); err == nil {
			needed[name] = true
		}
	}
	var secret []string
	for name := range needed {
		p, _ := s.providers.Lookup(name)
		if p.Available != nil {
			if err := p.Available(); err != nil {
				return nil, fmt.Errorf("provider %s cannot work on this host: %s: %w", name, err.Error(), kite.ErrState)
			}
		}
		if !p.HasPart(provider.PartCredential) {
			continue
		}
		id := credIDs[name]
		if id == "" {
			if id, err = s.pickCredential(ctx, team, name); err != nil {
				return nil, err
			}
		}
		cred, _, err := s.credentialFor(ctx, c, id, name)
		if err != nil {
			return nil, err
		}
		vars, sec := credentialVariables(p, cred)
		isSecret := map[string]bool{}
		for _, n := range sec {
			isSecret[n] = true
		}
		for _, k := range slices.Sorted(maps.Keys(vars)) {
			if _, user := b.variables[k]; !user {
				b.variables[k] = vars[k]
			}
			// Declared for the template (unless it does so itself), so provider blocks can use
			// them and Terraform does not warn about undeclared values.
			if err := cfg.DeclareVariable(k, "", isSecret[k]); err != nil {
				return nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
			}
		}
		secret = append(secret, sec...)
		b.creds[name], b.credIDs[name] = cred, id
	}
	sort.Strings(secret)
	if err := cfg.CheckSecretRefs(secret); err != nil {
		return nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	b.files, b.cfg = cfg.Files(), cfg
	return b, nil
}

// pickCredential returns the team's only credential for provider p.
func (s *Server) pickCredential(ctx context.Context, team, p string) (string, error) {
	cs, err := s.store.Credentials().List(ctx, store.CredentialFilter{Teams: []string{team}, Provider: p, Limit: 2})
	if err != nil {
		return "", err
	}
	switch len(cs) {
	case 0:
		return "", fmt.Errorf("provider %s needs a credential: add one with `kloud credential add --provider %s`: %w", p, p, kite.ErrInvalidParams)
	case 1:
		return cs[0].ID, nil
	}
	return "", fmt.Errorf("team %s has several %s credentials: choose one with --credential %s=ID: %w", team, p, p, kite.ErrInvalidParams)
}

// plan runs terraform plan on a built template and returns the machines it would create,
// checked against the providers' constraints for owner (a provider's bounds may be the owner's:
// the vagrant provider asks the owner's host).
func (s *Server) plan(ctx context.Context, contentID string, b *builtTemplate, owner string, logf func(string)) ([]api.PlannedMachine, error) {
	tf, err := s.terraformer()
	if err != nil {
		return nil, err
	}
	// A template may leave required_providers out: the build declares the providers (their
	// ApplyTemplate), and so does the plan.
	files, err := tmpl.DeclareProviders(b.files, s.providers.TemplatePolicy().Providers)
	if err != nil {
		return nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	if logf == nil {
		logf = planLog(ctx) // a plan job's log (stacks_plan.go)
	}
	ctx, cancel := s.planCtx(ctx) // limits.go: the plan timeout
	defer cancel()
	// A content id plans one at a time (terraformer's lease on its work dir): a plan of the same
	// template by the same user (concurrent stack.create, two tabs) waits for the other one, within
	// the plan timeout, rather than failing with terraformer's "locked".
	var id string
	for {
		id, err = tf.Plan(ctx, terraformer.Request{ContentID: contentID, Files: tfFiles(files), Variables: b.variables})
		if err == nil {
			break
		}
		if !errors.Is(err, kite.ErrConflict) {
			return nil, fmt.Errorf("terraform plan: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, s.planStopped(ctx)
		case <-time.After(250 * time.Millisecond):
		}
	}
	job, err := tf.Wait(ctx, id, func(ev tfrun.Event) {
		if logf != nil && ev.Line != "" {
			logf(ev.Line)
		}
	})
	if ctx.Err() != nil {
		s.stopTF(ctx, id) // no terraform left planning for a caller that is gone
		return nil, s.planStopped(ctx)
	}
	if job != nil && job.Err() != nil {
		// Terraform rejected the template: its diagnostic (file, line, summary) is the answer.
		return nil, fmt.Errorf("terraform plan: %s: %w", job.Err().Error(), kite.ErrInvalidParams)
	}
	if err != nil {
		return nil, fmt.Errorf("terraform plan: %w", err)
	}
	var out []api.PlannedMachine
	for _, ch := range job.Result.Changes {
		p := s.providers.ByResourceType(ch.Type)
		if ch.Mode != "managed" || p == nil || strings.HasPrefix(ch.Name, "kloud_") {
			continue
		}
		m := api.PlannedMachine{Label: ch.Name, Provider: p.Name, Resource: ch.Name, Configured: ch.Configured}
		if i, ok := index(ch.Index); ok {
			m.Index = &i
			m.Label = ch.Name + "." + strconv.Itoa(i)
		}
		if a, ok := ch.After.(map[string]any); ok {
			m.Attributes = a
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Label < out[j].Label })
	if err := s.checkPlannedCount(b, len(out)); err != nil { // limits.go
		return nil, err
	}
	if err := s.checkConstraints(ctx, owner, b.team, out); err != nil { // constraints.go
		return nil, err
	}
	return out, nil
}

func index(v any) (int, bool) {
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

func (s *Server) templateFiles(ctx context.Context, c *Caller, p *api.StackPlanParams) (*Template, []File, error) {
	t, err := s.loadTemplate(ctx, c, p.TemplateID)
	if err != nil {
		return nil, nil, err
	}
	files, rev := t.Files, t.Rev
	if p.Rev != 0 && p.Rev != t.Rev {
		files = nil
		for _, r := range t.Revisions {
			if r.Rev == p.Rev {
				files, rev = r.Files, r.Rev
			}
		}
		if files == nil {
			return nil, nil, fmt.Errorf("template %s has no revision %d: %w", t.ID, p.Rev, kite.ErrNotFound)
		}
	}
	t.Rev = rev
	return t, files, nil
}

// planTemplate plans a new stack of p's template revision for c (stack.plan and stack.create):
// its credentials and variables resolved, the machine cap checked before terraform and on its
// plan, and the plan's machines within c's and the team's quotas.
func (s *Server) planTemplate(ctx context.Context, c *Caller, p *api.StackPlanParams) (*Template, []File, *builtTemplate, []api.PlannedMachine, error) {
	t, files, err := s.templateFiles(ctx, c, p)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	b, err := s.build(ctx, c, t.Team, fileMap(files), p.Credentials, p.Variables)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := s.capBuild(t, b); err != nil { // limits.go
		return nil, nil, nil, nil, err
	}
	ms, err := s.plan(ctx, "plan-"+t.ID+"-"+c.Username, b, c.Username, nil)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := s.checkQuota(ctx, c.Username, t.Team, "", ms); err != nil { // quota.go
		return nil, nil, nil, nil, err
	}
	return t, files, b, ms, nil
}

func (s *Server) stackPlan(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackPlanParams) (any, error) {
	if p.StackID != "" {
		return s.stackPlanUpdate(ctx, c, p) // stacks_update.go
	}
	t, _, _, ms, err := s.planTemplate(ctx, c, p)
	if err != nil {
		return nil, err
	}
	return api.StackPlanResult{Machines: ms, TemplateID: t.ID, Rev: t.Rev}, nil
}

func (s *Server) stackCreate(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackPlanParams) (any, error) {
	t, files, b, ms, err := s.planTemplate(ctx, c, p)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("template %s declares no machines (resources of: %s): %w", t.ID, strings.Join(s.resourceTypes(), ", "), kite.ErrInvalidParams)
	}
	now := s.store.Now()
	st := Stack{ID: store.NewID(), Title: p.Title, Team: t.Team, Owner: c.Username, TemplateID: t.ID, TemplateRev: t.Rev,
		Files: files, Credentials: b.credIDs, Variables: p.Variables, State: StackNotInitialized, CreatedAt: now, UpdatedAt: now}
	if st.Title == "" {
		st.Title = t.Title
	}
	var machines []Machine
	for _, pm := range ms {
		m := Machine{ID: store.NewID(), StackID: st.ID, Label: pm.Label, Resource: pm.Resource, Index: pm.Index, Provider: pm.Provider,
			Owner: c.Username, Team: t.Team, State: provider.NotInitialized, Agent: Agent{Status: AgentNever},
			Attributes: pm.Attributes, CreatedAt: now, UpdatedAt: now}
		st.Machines = append(st.Machines, m.ID)
		machines = append(machines, m)
	}
	// The machines first: a stack document never points at machines that do not exist.
	if err := s.store.Machines().InsertMany(ctx, machines); err != nil {
		return nil, fmt.Errorf("save machines: %w", err)
	}
	if err := s.store.Stacks().Insert(ctx, st); err != nil {
		return nil, fmt.Errorf("save stack: %w", err)
	}
	return api.StackCreateResult{Stack: st, Machines: machines}, nil
}

func (s *Server) resourceTypes() []string {
	var out []string
	for _, n := range s.providers.Names() {
		p, _ := s.providers.Lookup(n)
		out = append(out, p.ResourceType)
	}
	return out
}

func (s *Server) loadStack(ctx context.Context, c *Caller, id string) (*Stack, error) {
	st, err := s.store.Stacks().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && c != nil && st.Owner != c.Username && !c.TeamAdmin(st.Team) {
		return nil, notFound("stack", id)
	}
	if err != nil {
		return nil, err
	}
	return &st, nil
}

func (s *Server) stackMachines(ctx context.Context, stackID string) ([]Machine, error) {
	return s.store.Machines().ByStack(ctx, stackID)
}

func (s *Server) stackApply(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackApplyParams) (_ any, err error) {
	defer func() {
		if err != nil {
			s.log.WarnContext(ctx, "stack.apply refused", "stack", p.StackID, "by", c.Username, "destroy", p.Destroy, "err", err)
		}
	}()
	st, err := s.loadStack(ctx, c, p.StackID)
	if err != nil {
		return nil, err
	}
	if !p.Destroy {
		if err := s.checkPolicy(ctx, st.Team, fileMap(st.Files)); err != nil { // policy.go: refused before a job, never a Failed stack
			return nil, err
		}
		// A stack built before (Initialized, or Failed by an update) converges as an update to
		// its own files: machines terraform leaves alone keep their ids, disks and agents (a
		// no-op when nothing drifted). Its plan checks the constraints on the template's planned
		// values.
		if st.State == StackInitialized || s.failedUpdate(ctx, st) { // stacks_update.go
			return s.reapplyUpdate(ctx, c, st)
		}
		if err := s.checkStackConstraints(ctx, st); err != nil { // constraints.go
			return nil, err
		}
		if err := s.checkStackCap(ctx, st); err != nil { // limits.go
			return nil, err
		}
		release, err := s.applyQuota(ctx, st) // quota.go: held until the stack is Building
		if err != nil {
			return nil, err
		}
		defer release()
	}
	sj := stackJob{kind: jobStackApply, lease: "apply", verb: "build", noun: "build", from: []string{StackNotInitialized, StackFailed}, to: StackBuilding}
	if p.Destroy {
		sj.verb, sj.noun, sj.from, sj.to = "destroy", "destroy", []string{StackNotInitialized, StackFailed, StackInitialized}, StackDestroying
	}
	return s.beginStackJob(ctx, c, st, sj, func(st *Stack, lease string) (map[string]any, error) {
		return stackbuild.ApplyParams{StackID: st.ID, Destroy: p.Destroy, Lease: lease}.Map(), nil
	})
}

// stackJob says which stack job beginStackJob starts.
type stackJob struct {
	kind  string   // the job's kind (jobStackApply, jobStackUpdate)
	lease string   // the lease owner's prefix ("apply", "update")
	verb  string   // "it can VERB only from": "build", "destroy", "be updated"
	noun  string   // "could not start the NOUN job"
	from  []string // the states the stack may be in
	to    string   // the state it is in while the job runs (Building, Destroying)
	set   store.StackSet
}

// beginStackJob starts a stack job: it takes the stack's lease (one job per stack at a time:
// whoever loses is told who holds it); a stack (or its machines) left in a transitional state by
// a job that is over is reconciled first, so jobs start from "any state whose job is dead";
// params gives the job's params from the stack as it is now and the lease owner (or refuses:
// nothing changed then); the stack moves from sj.from to sj.to with the job's id (and sj.set) in
// one update, so it never shows a transitional state with another (dead) job's id, which the
// reconciler would act on; then the job starts. When something fails, the stack is rolled back
// and the lease released.
func (s *Server) beginStackJob(ctx context.Context, c *Caller, st *Stack, sj stackJob, params func(st *Stack, lease string) (map[string]any, error)) (any, error) {
	owner, release, err := s.takeLease(ctx, "stack/"+st.ID, sj.lease, "stack "+st.ID+" is busy")
	if err != nil {
		return nil, err
	}
	if st, err = s.reconcileForApply(ctx, st, owner); err != nil {
		release()
		return nil, err
	}
	ps, err := params(st, owner)
	if err != nil {
		release()
		return nil, err
	}
	id := store.NewID()
	set := sj.set
	set.State, set.Reason, set.JobID = new(sj.to), new(""), new(id)
	ok, err := s.store.Stacks().Transition(ctx, st.ID, sj.from, set)
	if err != nil || !ok {
		release()
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("stack %s is %s; it can %s only from %s: %w", st.ID, st.State, sj.verb, strings.Join(sj.from, ", "), kite.ErrState)
	}
	if _, err := s.startJobID(ctx, id, sj.kind, "stack/"+st.ID, c.Username, ps); err != nil {
		back := store.StackSet{State: new(st.State), Reason: new(fmt.Sprintf("could not start the %s job: %v", sj.noun, err))}
		if st.JobID != "" {
			back.JobID = new(st.JobID)
		}
		rerr := s.store.Persist(ctx, "roll back stack "+st.ID, 0, func(ctx context.Context) error {
			_, err := s.store.Stacks().TransitionOfJob(ctx, st.ID, []string{sj.to}, id, back)
			return err
		})
		if rerr != nil {
			s.log.ErrorContext(ctx, "roll back stack after a job that did not start (the reconciler will)", "stack", st.ID, "err", rerr)
		}
		release()
		return nil, err
	}
	return api.JobRef{JobID: id}, nil
}

func (s *Server) runStackApply(ctx context.Context, j *jobCtx, recovering bool) (res map[string]any, err error) {
	params, err := stackbuild.ParseApplyParams(j.Params)
	if err != nil {
		return nil, err
	}
	stackID, destroy, owner := params.StackID, params.Destroy, params.Lease
	during := StackBuilding
	if destroy {
		during = StackDestroying
	}
	// No state without an exit: however this job ends (an error anywhere, a cancel, a panic),
	// a stack still in this job's transitional state is moved to Failed, and its machines out
	// of theirs, before the job is finished.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("internal error: %v", p)
		}
		if err != nil {
			s.exitStack(ctx, j, stackID, during, err)
		}
	}()
	st, c, stop, err := s.resumeStackJob(ctx, j, recovering, stackID, owner, during)
	defer stop()
	if err != nil {
		return nil, err
	}
	if destroy {
		return s.destroyStack(ctx, j, c, st)
	}
	return s.buildStack(ctx, j, c, st, recovering)
}

// resumeStackJob is the start of stack job j's run (of stack stackID, holding lease, the stack
// during in its transitional state): a job resumed after a restart (recovering) takes its lease
// again, unless it was cancelled meanwhile; the lease is renewed until stop (never nil: defer
// it at once); the stack must still be the job's (errNotThisJobs); the job runs as its owner c.
func (s *Server) resumeStackJob(ctx context.Context, j *jobCtx, recovering bool, stackID, lease, during string) (st *Stack, c *Caller, stop func(), err error) {
	stop = func() {}
	if recovering {
		if j.CancelRequested {
			return nil, nil, stop, fmt.Errorf("cancelled while no kloud ran it: %w", store.ErrJobCancelled)
		}
		// The lease may still be ours (same owner) or have expired: take it again either way.
		// Someone may hold it for a moment (a stack.apply or stack.reset that looks, finds this
		// job live, and lets go): try for a while.
		if err := s.retakeLease(ctx, "stack/"+stackID, lease); err != nil {
			return nil, nil, stop, fmt.Errorf("stack %s: %w", stackID, err)
		}
		j.Logf(ctx, "kloud restarted during this job; resuming")
	}
	stop = s.keepLease(context.Background(), "stack/"+stackID, lease)
	if st, err = s.loadStack(ctx, nil, stackID); err != nil {
		return nil, nil, stop, err
	}
	if st.State != during || st.JobID != j.ID {
		// Reconciled or reset while this job was not running (e.g. recovered after a long
		// outage): the stack is no longer this job's.
		return nil, nil, stop, fmt.Errorf("stack %s is %s (job %q): %w", st.ID, st.State, st.JobID, errNotThisJobs)
	}
	if c, err = s.callerByName(ctx, j.Owner, false); err != nil {
		return nil, nil, stop, err
	}
	return st, c, stop, nil
}

// errNotThisJobs: a job found its target reconciled or reset while it was not running.
var errNotThisJobs = fmt.Errorf("no longer in this job's hands (reconciled or reset meanwhile): %w", kite.ErrState)

// exitStack is the last resort of a stack job that returned an error: if the stack is still in
// the job's transitional state (the job's own failure bookkeeping did not land), it moves it to
// Failed, and its machines in Building or Terminating to Unknown, with the job's error as the
// reason. Each change is conditional on the stack still belonging to the job.
func (s *Server) exitStack(ctx context.Context, j *jobCtx, stackID, during string, jobErr error) {
	if errors.Is(jobErr, errNotThisJobs) {
		return
	}
	reason := jobErr.Error()
	if ctx.Err() != nil && !strings.Contains(reason, "cancelled") {
		reason = "cancelled: " + reason
	}
	var moved bool
	err := s.store.Persist(ctx, "fail stack "+stackID, 0, func(ctx context.Context) error {
		ok, err := s.store.Stacks().TransitionOfJob(ctx, stackID, []string{during}, j.ID,
			store.StackSet{State: new(StackFailed), Reason: new(reason)})
		moved = ok
		return err
	})
	if err != nil {
		s.log.ErrorContext(ctx, "fail stack (the reconciler will)", "stack", stackID, "job", j.ID, "err", err)
		return
	}
	if moved {
		s.log.WarnContext(ctx, "stack job ended without its bookkeeping; stack moved to Failed", "stack", stackID, "job", j.ID, "reason", reason)
	}
	ms, err := s.stackMachinesRetry(ctx, stackID)
	if err != nil {
		s.log.ErrorContext(ctx, "load machines of a failed stack (the reconciler will fix their states)", "stack", stackID, "err", err)
		return
	}
	for _, m := range ms {
		if ms := m.State; ms == provider.Building || ms == provider.Terminating {
			s.setMachine(ctx, m.ID, []provider.State{ms}, store.MachineSet{State: new(string(provider.Unknown)), Reason: new(reason)})
		}
	}
}

// stackMachinesRetry is stackMachines for bookkeeping: with its own context, retried.
func (s *Server) stackMachinesRetry(ctx context.Context, stackID string) ([]Machine, error) {
	var ms []Machine
	err := s.store.Persist(ctx, "load machines of stack "+stackID, 0, func(ctx context.Context) error {
		var err error
		ms, err = s.stackMachines(ctx, stackID)
		return err
	})
	return ms, err
}

// setStack changes a stack. It is bookkeeping: written with its own context and retried until
// the store has it (see store.Store.Persist), so a cancelled job still leaves an honest state.
func (s *Server) setStack(ctx context.Context, id string, set store.StackSet) {
	err := s.store.Persist(ctx, "update stack "+id, 0, func(ctx context.Context) error {
		return s.store.Stacks().Set(ctx, id, set)
	})
	if err != nil {
		s.log.ErrorContext(ctx, "update stack", "stack", id, "err", err)
	}
}

// setMachine changes a machine; with from set, only if its state is one of them. Like setStack
// it has its own context and retries.
func (s *Server) setMachine(ctx context.Context, id string, from []provider.State, set store.MachineSet) bool {
	if from == nil {
		err := s.store.Persist(ctx, "update machine "+id, 0, func(ctx context.Context) error {
			return s.store.Machines().Set(ctx, id, set)
		})
		if err != nil {
			s.log.ErrorContext(ctx, "update machine", "machine", id, "err", err)
		}
		return err == nil
	}
	fs := make([]string, len(from))
	for i, f := range from {
		fs[i] = string(f)
	}
	var ok bool
	err := s.store.Persist(ctx, "update machine "+id, 0, func(ctx context.Context) error {
		var err error
		ok, err = s.store.Machines().Transition(ctx, id, fs, set)
		return err
	})
	if err != nil {
		s.log.ErrorContext(ctx, "update machine", "machine", id, "err", err)
	}
	return ok
}

// failBuild puts the stack and its machines back into an honest state after a failed build:
// the stack Failed; machines back to the state they had before the build (ms is read before
// they were set Building) if terraform never ran in this attempt, else Unknown (terraform may
// have made them: machine.info asks the provider, and the stack can be built again or
// destroyed). If ctx was cancelled, a terraform run still going is stopped first.
func (s *Server) failBuild(ctx context.Context, st *Stack, ms []Machine, reason error) error {
	return s.failBuildAfter(ctx, st, ms, false, "", reason)
}

// failBuildTF is failBuild once terraform may have run (tfJob: its run, if known).
func (s *Server) failBuildTF(ctx context.Context, st *Stack, ms []Machine, tfJob string, reason error) error {
	return s.failBuildAfter(ctx, st, ms, true, tfJob, reason)
}

func (s *Server) failBuildAfter(ctx context.Context, st *Stack, ms []Machine, tfRan bool, tfJob string, reason error) error {
	if ctx.Err() != nil {
		reason = fmt.Errorf("build cancelled: %w", reason)
	}
	s.stopTF(ctx, tfJob)
	for _, m := range ms {
		back := m.State
		if tfRan || back.InProgress() {
			back = provider.Unknown
		}
		s.setMachine(ctx, m.ID, []provider.State{provider.Building}, store.MachineSet{State: new(string(back)), Reason: new(reason.Error())})
	}
	s.setStack(ctx, st.ID, store.StackSet{State: new(StackFailed), Reason: new(reason.Error())})
	return reason
}

// stopTF cancels terraformer's run tfJob when the job's ctx was cancelled (a cancelled build
// or destroy must not leave terraform running), and waits until it stopped.
func (s *Server) stopTF(ctx context.Context, tfJob string) {
	if tfJob == "" || ctx.Err() == nil {
		return
	}
	tf, err := s.terraformer()
	if err != nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if _, err := tf.Cancel(cctx, tfJob); err != nil && !errors.Is(err, kite.ErrState) {
		s.log.WarnContext(ctx, "cancel terraform run of a cancelled job", "tf_job", tfJob, "err", err)
	}
}

func (s *Server) buildStack(ctx context.Context, j *jobCtx, c *Caller, st *Stack, recovering bool) (map[string]any, error) {
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return nil, err
	}
	tf, err := s.terraformer()
	if err != nil {
		return nil, s.failBuild(ctx, st, ms, err)
	}
	tfJob := ""
	if recovering {
		var cur store.Stack
		// A read that fails must not look like "no run recorded" (that builds again).
		if err := s.store.Persist(ctx, "read stack "+st.ID, 0, func(ctx context.Context) error {
			var err error
			cur, err = s.store.Stacks().Get(ctx, st.ID)
			return err
		}); err != nil {
			return nil, s.failBuildTF(ctx, st, ms, "", fmt.Errorf("read the recorded terraform run: %w", err))
		}
		tfJob = cur.TFJobID
		if tfJob == "" {
			// Killed before terraform's run was recorded: it may not have started, or may be
			// running still. Build again from the start; terraformer's lease makes the new run
			// wait for an old one, and terraform converges on what it left.
			j.Logf(ctx, "kloud restarted before terraform's run was recorded; building again")
			for _, m := range ms {
				s.setMachine(ctx, m.ID, []provider.State{provider.Building}, store.MachineSet{State: new(string(provider.NotInitialized))})
			}
			if ms, err = s.stackMachines(ctx, st.ID); err != nil {
				return nil, err
			}
			recovering = false
		}
	}
	if !recovering {
		j.Enter(ctx, stackbuild.BuildChecking)
		// A stack builds from NotInitialized or Failed: its machines may be in any settled
		// state (a failed or cancelled build leaves them Unknown); terraform converges on the
		// template. A machine in a transition has a job of its own at work.
		for _, m := range ms {
			if m.State.InProgress() {
				return nil, s.failBuild(ctx, st, nil, fmt.Errorf("machine %s is %s (a job is changing it); build again when it is done", m.Label, m.State))
			}
		}
		for i, m := range ms {
			if !s.setMachine(ctx, m.ID, settledStates(), store.MachineSet{State: new(string(provider.Building)), Reason: new("")}) {
				return nil, s.failBuild(ctx, st, ms[:i], fmt.Errorf("machine %s changed state meanwhile", m.Label))
			}
		}
		j.Enter(ctx, stackbuild.BuildCredentials)
		b, err := s.build(ctx, c, st.Team, fileMap(st.Files), st.Credentials, st.Variables)
		if err != nil {
			return nil, s.failBuild(ctx, st, ms, err)
		}
		j.Enter(ctx, stackbuild.BuildUserData)
		// Every agent's configuration first (keys minted, kite ids recorded); the providers'
		// rewrite below only renders them into the template and writes nothing.
		agents, err := s.mintAgents(ctx, st, ms)
		if err != nil {
			return nil, s.failBuild(ctx, st, ms, err)
		}
		tpl := &provider.Template{Files: b.files, Variables: b.variables, Config: b.cfg}
		for _, name := range slices.Sorted(maps.Keys(b.providers)) {
			p, _ := s.providers.Lookup(name)
			bs := &provider.BaseStack{Provider: p, StackID: st.ID, Team: st.Team, Owner: st.Owner, Template: tpl, Log: s.log.With("stack", st.ID, "provider", name),
				AgentConfig: agents.config}
			for i := range ms {
				if ms[i].Provider == name {
					bs.Machines = append(bs.Machines, machineSpec(&ms[i]))
				}
			}
			stack, err := p.Stack(bs)
			if err != nil {
				return nil, s.failBuild(ctx, st, ms, fmt.Errorf("provider %s: %w", name, err))
			}
			if tpl, err = stack.ApplyTemplate(ctx, b.creds[name]); err != nil {
				return nil, s.failBuild(ctx, st, ms, fmt.Errorf("provider %s: %w", name, err))
			}
			bs.Template = tpl
		}
		j.Enter(ctx, stackbuild.BuildResources)
		tfJob, err = submitTF(ctx, j, func() (string, error) {
			return tf.Apply(ctx, terraformer.Request{ContentID: "stack-" + st.ID, Files: tfFiles(tpl.Files), Variables: tpl.Variables, TraceID: j.ID})
		})
		if err != nil {
			return nil, s.failBuild(ctx, st, ms, fmt.Errorf("terraform apply: %w", err))
		}
		s.setStack(ctx, st.ID, store.StackSet{TFJobID: new(tfJob)})
	}
	if ctx.Err() != nil {
		return nil, s.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("terraform apply: %w", ctx.Err()))
	}
	job, err := tf.Wait(ctx, tfJob, applyProgress(ctx, j))
	if err != nil {
		return nil, s.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("terraform apply: %w", err))
	}
	if err := job.Err(); err != nil {
		return nil, s.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("terraform apply: %w", err))
	}
	ms, err = s.stackMachines(ctx, st.ID) // as recorded (kite ids by mintAgents, also of an attempt before a restart)
	if err != nil {
		return nil, s.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("load machines: %w", err))
	}
	j.Enter(ctx, stackbuild.BuildAgents)
	results := s.waitAgents(ctx, j, st, ms, job.Result)
	if ctx.Err() != nil {
		return nil, s.failBuildTF(ctx, st, ms, tfJob, fmt.Errorf("while waiting for the machines' agents: %w", ctx.Err()))
	}
	j.Enter(ctx, stackbuild.BuildSettings)
	failed := s.settleMachines(ctx, c, ms, results)
	s.keepPorts(ctx, j, st) // ports.go: a machine built again gets its recorded rules
	return s.settleStack(ctx, j, st, failed, fmt.Sprintf("%d of %d machines are not ready", len(failed), len(ms)),
		map[string]any{"stackId": st.ID, "machines": len(ms)})
}

// settleMachines records how each machine a build or an update waited for ended (ms and
// results of waitAgents, in the same order; waitAgents filled the attributes from the state):
// Running with its agent connected, or, when the agent did not come, the state its provider
// reports (Unknown if it cannot tell) with the failure as the reason. Only machines still
// Building change. It returns the failures.
func (s *Server) settleMachines(ctx context.Context, c *Caller, ms []Machine, results []stackbuild.AgentResult) []string {
	var failed []string
	for i, m := range ms {
		r := results[i]
		set := store.MachineSet{Attributes: m.Attributes, Reason: new("")}
		if ip := ipOf(m.Attributes); ip != "" {
			set.IPAddress = new(ip)
		}
		state := provider.Running
		if !r.OK {
			failed = append(failed, r.Err.Error())
			set.Reason = new(fmt.Sprintf("%s failed: %s", r.Step, r.Err.Error()))
			state = provider.Unknown
			if pm, err := s.providerMachine(ctx, c, &m); err == nil && s.capable(m.Provider, api.MethodMachineInfo, provider.CapInfo) == nil {
				if infra, _, err := pm.Info(ctx); err == nil && infra != provider.Unknown {
					state = infra
				}
			}
		} else {
			version := ""
			if r.Info != nil {
				version = r.Info.Version
			}
			s.setAgent(ctx, m.KiteID, AgentConnected, version)
		}
		set.State = new(string(state))
		s.setMachine(ctx, m.ID, []provider.State{provider.Building}, set)
	}
	return failed
}

// applyProgress follows a terraform apply of a build or an update in job j: the resources' stage
// and percentage, each resource's message once (progress repeats it), terraform's diagnostics.
func applyProgress(ctx context.Context, j *jobCtx) func(tfrun.Event) {
	said := map[string]string{} // the last message logged per resource
	return func(ev tfrun.Event) {
		if ev.Type == tfrun.EventProgress && ev.Resource != nil {
			j.EnterAt(ctx, stackbuild.BuildResources, ev.Percent)
			if msg := ev.Resource.Message; msg != "" && said[ev.Resource.Address] != msg {
				said[ev.Resource.Address] = msg
				j.Logf(ctx, "%s", msg)
			}
		}
		if ev.Type == tfrun.EventDiagnostic && ev.Diagnostic != nil {
			j.Logf(ctx, "terraform: %s", ev.Diagnostic.String())
		}
	}
}

// settleStack ends a build or an update whose machines are settled: the stack is Initialized,
// with reason if some machines failed (the job then fails with their failures), and the job
// returns res.
func (s *Server) settleStack(ctx context.Context, j *jobCtx, st *Stack, failed []string, reason string, res map[string]any) (map[string]any, error) {
	if len(failed) > 0 {
		s.setStack(ctx, st.ID, store.StackSet{State: new(StackInitialized), Reason: new(reason)})
		return map[string]any{"stackId": st.ID}, fmt.Errorf("%s:\n%s", reason, strings.Join(failed, "\n"))
	}
	s.setStack(ctx, st.ID, store.StackSet{State: new(StackInitialized), Reason: new("")})
	j.Enter(ctx, stackbuild.BuildDone)
	return res, nil
}

func (s *Server) waitAgents(ctx context.Context, j *jobCtx, st *Stack, ms []Machine, res *tfrun.Result) []stackbuild.AgentResult {
	pl := s.planner()
	c, _ := s.callerByName(ctx, st.Owner, false)
	var ex []stackbuild.Expect
	for i := range ms {
		m := &ms[i]
		m.Attributes = resourceValues(res, m)
		e := stackbuild.Expect{Label: m.Label, KiteID: m.KiteID, Provider: s.providerOf(m.Provider)}
		if pm, err := s.providerMachine(ctx, c, m); err == nil {
			e.Machine = pm
		}
		ex = append(ex, e)
	}
	return pl.Wait(ctx, ex, func(r stackbuild.AgentResult) {
		if r.OK {
			j.Logf(ctx, "%s: agent connected", r.Label)
		} else {
			j.Logf(ctx, "%s: %s failed: %v", r.Label, r.Step, r.Err)
		}
	})
}

// resourceValues returns the state values of m's resource instance.
func resourceValues(res *tfrun.Result, m *Machine) map[string]any {
	r := stateResource(res, m)
	if r == nil || r.Values == nil {
		return map[string]any{}
	}
	return visibleAttrs(r.Values) // not the agent's kite key (user data and the like)
}

// stateResource is m's resource instance in terraform's state res (nil if it has none).
func stateResource(res *tfrun.Result, m *Machine) *tfrun.StateResource {
	if res == nil {
		return nil
	}
	for i, r := range res.Resources {
		if r.Mode != "managed" || r.Name != m.Resource || r.Module != "" {
			continue
		}
		n, has := index(r.Index)
		if (m.Index == nil && !has) || (m.Index != nil && has && *m.Index == n) {
			return &res.Resources[i]
		}
	}
	return nil
}

func ipOf(attrs map[string]any) string {
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

// settledStates are the machine states no job is changing (not Building, Starting, Stopping or
// Terminating).
func settledStates() []provider.State {
	var out []provider.State
	for _, st := range provider.States {
		if !st.InProgress() {
			out = append(out, st)
		}
	}
	return out
}

func machineSpec(m *Machine) *provider.MachineSpec {
	return &provider.MachineSpec{ID: m.ID, Label: m.Label, Resource: m.Resource, Index: m.Index, Provider: m.Provider,
		KiteID: m.KiteID, Owner: m.Owner, Attributes: m.Attributes}
}

// kloudURLFor is the URL a provider's machines reach kloud at.
func (s *Server) kloudURLFor(p *provider.Provider) string {
	if p.KloudURL != nil {
		return p.KloudURL(s.opts.PublicURL)
	}
	return s.opts.PublicURL
}

// mintAgents prepares every machine's agent before any provider rewrites the template: it
// mints a fresh kite key per machine (its id is what the planner waits for), records the ids on
// the machines (ms too) before Terraform runs, so a restart can still find them, and returns each
// machine's agent configuration for the providers to render into user data.
func (s *Server) mintAgents(ctx context.Context, st *Stack, ms []Machine) (agentConfigs, error) {
	if s.klientSum == "" {
		return nil, fmt.Errorf("kloud has no klient binary to give machines (looked at %s): %w", s.opts.KlientBin, kite.ErrState)
	}
	out := agentConfigs{}
	for i := range ms {
		m := &ms[i]
		p, err := s.providers.Lookup(m.Provider)
		if err != nil {
			return nil, fmt.Errorf("machine %s: %w", m.Label, err)
		}
		url := s.kloudURLFor(p)
		kiteID := AgentKitePrefix + uuid.NewString()
		key, _, err := s.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: st.Owner, MachineID: m.ID, StackID: st.ID, KiteID: kiteID, KontrolURL: url + "/kite"})
		if err != nil {
			return nil, fmt.Errorf("machine %s: agent key: %w", m.Label, err)
		}
		out[m.ID] = userdata.Config{
			Username: st.Owner, KiteKey: key, KontrolURL: url + "/kite", KlientURL: url + "/dl/klient", KlientSHA256: s.klientSum,
			CACert: s.opts.CACert,
		}
		m.KiteID = kiteID
	}
	ids := make(map[string]string, len(ms))
	for _, m := range ms {
		ids[m.ID] = m.KiteID
	}
	sealed, err := s.sealAgents(out) // stacks_update.go: kept for stack.update
	if err != nil {
		return nil, err
	}
	if err := s.store.Persist(ctx, "record kite ids of stack "+st.ID, 0, func(ctx context.Context) error {
		if err := s.store.Machines().SetKiteIDs(ctx, ids, Agent{Status: AgentNever}); err != nil {
			return err
		}
		return s.store.Machines().SetAgentSealed(ctx, sealed)
	}); err != nil {
		return nil, fmt.Errorf("record the machines' kite ids: %w", err)
	}
	return out, nil
}

// agentConfigs are the machines' agent configurations by machine id (mintAgents).
type agentConfigs map[string]userdata.Config

// config is provider.BaseStack.AgentConfig: a lookup, nothing minted or written.
func (a agentConfigs) config(_ context.Context, m *provider.MachineSpec) (userdata.Config, error) {
	c, ok := a[m.ID]
	if !ok {
		return userdata.Config{}, fmt.Errorf("machine %s has no agent configuration", m.Label)
	}
	return c, nil
}

func (s *Server) destroyStack(ctx context.Context, j *jobCtx, c *Caller, st *Stack) (map[string]any, error) {
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return nil, err
	}
	j.Enter(ctx, stackbuild.DestroyMachines)
	for i, m := range ms {
		// A machine a start or stop job is changing is not taken from under it.
		if !s.setMachine(ctx, m.ID, settledStates(), store.MachineSet{State: new(string(provider.Terminating))}) {
			return nil, s.failDestroy(ctx, st, ms[:i], "", fmt.Errorf("machine %s is %s (a job is changing it); destroy again when it is done", m.Label, m.State))
		}
	}
	// Always ask terraform: a build may have created resources even if kloud never recorded its
	// run (it was killed right after submitting it). Terraformer knowing no files for the stack
	// means nothing was ever applied.
	tf, err := s.terraformer()
	if err != nil {
		return nil, s.failDestroy(ctx, st, ms, "", err)
	}
	// The template policy holds for destroy too: terraform destroy evaluates the stack's files
	// (destroy-time provisioners, functions). A stack whose files break it is destroyed only once
	// an administrator trusts them, unless terraform holds nothing of it (then there is nothing a
	// destroy could run).
	var id string
	if perr := s.checkDestroyPolicy(ctx, st.Team, fileMap(st.Files)); perr != nil {
		state, serr := tf.State(ctx, "stack-"+st.ID)
		if serr == nil && !stateEmpty(state) || serr != nil && !errors.Is(serr, kite.ErrNotFound) {
			return nil, s.failDestroy(ctx, st, ms, "", fmt.Errorf("destroy: %w", perr))
		}
		err = kite.ErrNotFound
	} else {
		j.Enter(ctx, stackbuild.DestroyResources)
		id, err = submitTF(ctx, j, func() (string, error) {
			return tf.Destroy(ctx, terraformer.Request{ContentID: "stack-" + st.ID, TraceID: j.ID})
		})
	}
	switch {
	case errors.Is(err, kite.ErrNotFound):
		j.Logf(ctx, "terraform never ran for this stack: nothing to destroy")
	case err != nil:
		return nil, s.failDestroy(ctx, st, ms, "", fmt.Errorf("terraform destroy: %w", err))
	default:
		job, err := tf.Wait(ctx, id, func(ev tfrun.Event) {
			if ev.Type == tfrun.EventProgress {
				j.EnterAt(ctx, stackbuild.DestroyResources, ev.Percent)
			}
		})
		if err == nil {
			err = job.Err()
		}
		if err != nil {
			return nil, s.failDestroy(ctx, st, ms, id, fmt.Errorf("terraform destroy: %w", err))
		}
	}
	// Terraform destroyed everything: the rest is bookkeeping, done even if the job is
	// cancelled now (a cancel cannot bring the machines back).
	bctx := context.WithoutCancel(ctx)
	j.Enter(bctx, stackbuild.DestroyKeys)
	for _, m := range ms {
		if m.KiteID != "" {
			if err := s.Kontrol.Revoke(bctx, m.KiteID, "stack "+st.ID+" destroyed"); err != nil {
				s.log.WarnContext(ctx, "revoke machine key", "machine", m.ID, "err", err)
			}
		}
	}
	if err := s.store.Persist(bctx, "delete machines of stack "+st.ID, 0, func(ctx context.Context) error {
		return s.store.Machines().DeleteByStack(ctx, st.ID)
	}); err != nil {
		return nil, err
	}
	if err := s.store.Persist(bctx, "delete stack "+st.ID, 0, func(ctx context.Context) error {
		return s.store.Stacks().Delete(ctx, st.ID)
	}); err != nil {
		return nil, err
	}
	ctx = bctx
	j.Enter(ctx, stackbuild.DestroyDone)
	return map[string]any{"stackId": st.ID, "destroyed": true}, nil
}

// stateEmpty reports whether a terraform state holds no resources.
func stateEmpty(st *tfjson.State) bool {
	for range stateResources(st) {
		return false
	}
	return true
}

// stateResources yields every resource instance of st, of every module (none if st is nil).
func stateResources(st *tfjson.State) iter.Seq[*tfjson.StateResource] {
	return func(yield func(*tfjson.StateResource) bool) {
		if st == nil || st.Values == nil {
			return
		}
		var walk func(m *tfjson.StateModule) bool
		walk = func(m *tfjson.StateModule) bool {
			if m == nil {
				return true
			}
			for _, r := range m.Resources {
				if !yield(r) {
					return false
				}
			}
			for _, c := range m.ChildModules {
				if !walk(c) {
					return false
				}
			}
			return true
		}
		walk(st.Values.RootModule)
	}
}

// failDestroy puts the stack Failed and its Terminating machines Unknown (terraform may have
// destroyed some of them; destroy can be run again). If ctx was cancelled, terraform's run
// tfJob is stopped first.
func (s *Server) failDestroy(ctx context.Context, st *Stack, ms []Machine, tfJob string, reason error) error {
	if ctx.Err() != nil {
		reason = fmt.Errorf("destroy cancelled: %w", reason)
	}
	s.stopTF(ctx, tfJob)
	for _, m := range ms {
		s.setMachine(ctx, m.ID, []provider.State{provider.Terminating}, store.MachineSet{State: new(string(provider.Unknown)), Reason: new(reason.Error())})
	}
	s.setStack(ctx, st.ID, store.StackSet{State: new(StackFailed), Reason: new(reason.Error())})
	return reason
}

func (s *Server) stackDescribe(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackRef) (any, error) {
	st, err := s.loadStack(ctx, c, p.StackID)
	if err != nil {
		return nil, err
	}
	ms, err := s.stackMachines(ctx, st.ID)
	if err != nil {
		return nil, err
	}
	s.fillLatestRev(ctx, []*Stack{st}) // stacks_update.go
	return api.StackView{Stack: *st, MachineDocs: ms, Resets: st.Resets}, nil
}

func (s *Server) stackList(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackListParams) (any, error) {
	f := store.StackFilter{Owner: c.Username, Team: p.Team}
	if p.All {
		switch {
		case p.Team != "" && c.TeamAdmin(p.Team):
			f.Owner = ""
		case p.Team == "" && c.Admin:
			f = store.StackFilter{All: true}
		default:
			return nil, fmt.Errorf("listing every member's stacks needs a team admin: %w", kite.ErrPermission)
		}
	}
	sts, err := s.store.Stacks().List(ctx, f)
	if err != nil {
		return nil, err
	}
	s.fillLatestRev(ctx, stackPtrs(sts)) // stacks_update.go
	return api.StackListResult{Stacks: sts}, nil
}

// submitTF submits a terraform run; while terraformer says the stack is locked (a run of an
// earlier attempt, e.g. before kloud restarted, still going) it waits and tries again.
func submitTF(ctx context.Context, j *jobCtx, submit func() (string, error)) (string, error) {
	said := false
	for {
		id, err := submit()
		if !errors.Is(err, kite.ErrConflict) {
			return id, err
		}
		if !said {
			j.Logf(ctx, "terraform is still busy with this stack (%v); waiting", err)
			said = true
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(2 * time.Second):
		}
	}
}
