package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// Stacks: stack.plan (what a template would make), stack.create (machine documents), stack.apply
// (build or destroy, a durable job), stack.describe and stack.list.

const jobStackApply = stackbuild.JobApply

// stackLeaseTTL bounds how long a dead kloud keeps a stack, machine (or quota) locked
// (stackbuild's leases.go: a stack's and a machine's lease).
const stackLeaseTTL = stackbuild.LeaseTTL

// stackAPI serves stack.* (plan, planJob, create, apply, describe, list, reset, update, scale):
// its handlers check who may and what, call the build flow (kloud/stackbuild) or start its job,
// and answer. It makes kloud's plans (build, plan, the constraints) and is the build flow's
// Templates and Plans (stacks_deps.go). Server.stacks is the one value, made in New.
type stackAPI struct {
	store     *store.Store // its clock (Now) and Persist
	stacks    *store.Stacks
	machines  *store.Machines
	creds     *store.Credentials
	providers *provider.Registry
	log       *slog.Logger
	srv       stackServer // the Server's loaders, build flow, terraformer and jobs
	checks    stackChecks // the Server's policy, limit and quota checks
	planJobs  planSlots   // each user's running plan jobs (stacks_plan.go)
}

// stackServer is what the stack handlers use of the Server besides its checks (*Server is one):
// the loaders that check who may see a stack (loadStack, stacks.go), a template (loadTemplate,
// templates.go), a caller (authz.go) or a credential (credentials.go), and a stack's template
// (stackTemplate, limits.go);
// a template's machine resources (templates.go) and the providers' resource types; the build
// flow (stacks_deps.go), terraformer (server.go) and the jobs (jobs.go).
type stackServer interface {
	loadStack(ctx context.Context, c *Caller, id string) (*model.Stack, error)
	loadTemplate(ctx context.Context, c *Caller, id string) (*model.Template, error)
	stackTemplate(ctx context.Context, id string) *model.Template
	callerByName(ctx context.Context, username string, admin bool) (*Caller, error)
	credentialFor(ctx context.Context, c *Caller, id, providerName string) (*provider.Credential, []string, error)
	machineResources(files map[string][]byte) (*tmpl.Config, map[string][]tmpl.Resource, error)
	resourceTypes() []string
	resolveParams(files map[string][]byte, p *api.StackPlanParams) (resolvedParams, error) // params.go
	updateParamValues(st *model.Stack, files []model.File, changes map[string]json.RawMessage) (map[string]string, error)
	flow() *stackbuild.Flow
	terraformer() (Terraformer, error)
	startJob(ctx context.Context, id string, spec jobSpec, target, owner string) (string, error)
}

// stackChecks are the Server's checks a stack's plan and build pass (*Server is one): the
// template policy (policy.go), the machine cap and plan timeout (limits.go), the quotas
// (quota.go).
type stackChecks interface {
	checkPolicy(ctx context.Context, team string, files map[string][]byte, extraLift ...string) error
	checkPolicyParsed(ctx context.Context, team string, files map[string][]byte, cfg *tmpl.Config, extraLift ...string) error
	capBuild(t *model.Template, b *builtTemplate) error
	checkPlannedCount(b *builtTemplate, n int) error
	checkStackCap(ctx context.Context, st *model.Stack) error
	planCtx(ctx context.Context) (context.Context, context.CancelFunc)
	planStopped(ctx context.Context) error
	checkQuota(ctx context.Context, owner, team, except string, planned []api.PlannedMachine) error
	checkBucketQuota(ctx context.Context, owner, team, stackID string, specs []stackbuild.BucketSpec) error
	holdQuota(ctx context.Context, owner, team string) (release func(), err error)
	applyQuota(ctx context.Context, st *model.Stack) (release func(), err error)
}

// builtTemplate is a template ready for Terraform: files, variables, credentials.
type builtTemplate struct {
	files     map[string][]byte
	cfg       *tmpl.Config // files parsed: the one parse of a build, handed on to the providers
	variables map[string]any
	creds     map[string]*provider.Credential // provider → credential
	credIDs   map[string]string
	providers map[string][]string     // provider → machine resource names
	buckets   []stackbuild.BucketSpec // the kloud_bucket claims, taken out of files (buckets.go)
	params    resolvedParams          // the parameters' values (params.go; stack.create's)
	team      string                  // whose template and credentials
	// maxMachines is the cap on planned machines and capHow how to change it (capBuild,
	// limits.go; 0: kloud's global cap).
	maxMachines int
	capHow      string
}

// build resolves credentials and variables for files and checks that secrets reach only
// provider blocks. Providers also are configured too (credentials resolved) though the files
// declare no machines of theirs: an update that removes all of a provider's machines.
func (a *stackAPI) build(ctx context.Context, c *Caller, team string, files map[string][]byte, credIDs, vars map[string]string, also ...string) (*builtTemplate, error) {
	cfg, res, err := a.srv.machineResources(files)
	if err != nil {
		return nil, err
	}
	// The template policy again (kloud/policy.go): a template stored before it, or bypassing
	// template.create, does not run.
	if err := a.checks.checkPolicyParsed(ctx, team, files, cfg); err != nil {
		return nil, err
	}
	b := &builtTemplate{files: files, variables: map[string]any{}, creds: map[string]*provider.Credential{}, credIDs: map[string]string{}, providers: map[string][]string{},
		team: team}
	for k, v := range vars {
		// In Terraform's -var form: typed for the JSON var file (a number stays a number).
		if b.variables[k], err = cfg.TypedValue(k, v); err != nil {
			return nil, paramsError(err) // params.go
		}
	}
	for name, rs := range res {
		for _, r := range rs {
			b.providers[name] = append(b.providers[name], r.Name)
		}
	}
	if b.buckets, err = templateBuckets(a.providers, cfg, slices.Sorted(maps.Keys(res))); err != nil {
		return nil, err
	}
	if err := cfg.RemoveParams(); err != nil { // kloud_parameter, kloud_preset: params.go
		return nil, fmt.Errorf("template: %w", err)
	}
	needed := map[string]bool{}
	for name := range res {
		needed[name] = true
	}
	for _, name := range slices.Concat(cfg.Providers(), also) {
		if _, err := a.providers.Lookup(name); err == nil {
			needed[name] = true
		}
	}
	var secret []string
	for name := range needed {
		p, _ := a.providers.Lookup(name)
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
			if id, err = a.pickCredential(ctx, team, name); err != nil {
				return nil, err
			}
		}
		cred, _, err := a.srv.credentialFor(ctx, c, id, name)
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
func (a *stackAPI) pickCredential(ctx context.Context, team, p string) (string, error) {
	cs, err := a.creds.List(ctx, store.CredentialFilter{Teams: []string{team}, Provider: p, Limit: 2})
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
func (a *stackAPI) plan(ctx context.Context, contentID string, b *builtTemplate, owner string, logf func(string)) ([]api.PlannedMachine, error) {
	tf, err := a.srv.terraformer()
	if err != nil {
		return nil, err
	}
	// A template may leave required_providers out: the build declares the providers (their
	// ApplyTemplate), and so does the plan.
	files, err := tmpl.DeclareProviders(b.files, a.providers.TemplatePolicy().Providers)
	if err != nil {
		return nil, fmt.Errorf("template: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	if logf == nil {
		logf = planLog(ctx) // a plan job's log (stacks_plan.go)
	}
	ctx, cancel := a.checks.planCtx(ctx) // limits.go: the plan timeout
	defer cancel()
	// A content id plans one at a time (terraformer's lease on its work dir): a plan of the same
	// template by the same user (concurrent stack.create, two tabs) waits for the other one, within
	// the plan timeout, rather than failing with terraformer's "locked".
	// (A plan cancelled while terraformer accepted its run: tfclient cancels that run.)
	// A terraformer that is restarting is waited for (stackbuild.TFWait: up to a minute, said
	// in the plan's log), also within the plan timeout.
	var id string
	var down stackbuild.TFWait
	for {
		id, err = tf.Plan(ctx, tfapi.Request{ContentID: contentID, Files: tfapi.Files(files), Variables: b.variables})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, a.checks.planStopped(ctx)
		}
		if down.Retry(ctx, err, logf) {
			continue
		}
		if ctx.Err() != nil {
			return nil, a.checks.planStopped(ctx)
		}
		if !errors.Is(err, kite.ErrConflict) {
			return nil, fmt.Errorf("terraform plan: %w", down.Err(err))
		}
		select {
		case <-ctx.Done():
			return nil, a.checks.planStopped(ctx)
		case <-time.After(250 * time.Millisecond):
		}
	}
	job, err := tf.Wait(ctx, id, func(ev tfapi.Event) {
		if logf != nil && ev.Line != "" {
			logf(ev.Line)
		}
	})
	if ctx.Err() != nil {
		a.srv.flow().StopTF(ctx, id) // no terraform left planning for a caller that is gone
		return nil, a.checks.planStopped(ctx)
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
		p := a.providers.ByResourceType(ch.Type)
		if ch.Mode != "managed" || p == nil || strings.HasPrefix(ch.Name, "kloud_") {
			continue
		}
		m := api.PlannedMachine{Label: ch.Name, Provider: p.Name, Resource: ch.Name, Configured: ch.Configured}
		if i, ok := stackbuild.Index(ch.Index); ok {
			m.Index = &i
			m.Label = ch.Name + "." + strconv.Itoa(i)
		}
		if a, ok := ch.After.(map[string]any); ok {
			m.Attributes = a
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Label < out[j].Label })
	if err := a.checks.checkPlannedCount(b, len(out)); err != nil { // limits.go
		return nil, err
	}
	if err := a.checkConstraints(ctx, owner, b.team, out); err != nil { // constraints.go
		return nil, err
	}
	return out, nil
}

func (a *stackAPI) templateFiles(ctx context.Context, c *Caller, p *api.StackPlanParams) (*model.Template, []model.File, error) {
	t, err := a.srv.loadTemplate(ctx, c, p.TemplateID)
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
func (a *stackAPI) planTemplate(ctx context.Context, c *Caller, p *api.StackPlanParams) (*model.Template, []model.File, *builtTemplate, []api.PlannedMachine, error) {
	t, files, err := a.templateFiles(ctx, c, p)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	params, err := a.srv.resolveParams(fileMap(files), p) // params.go: before any terraform
	if err != nil {
		return nil, nil, nil, nil, err
	}
	b, err := a.build(ctx, c, t.Team, fileMap(files), p.Credentials, params.all())
	if err != nil {
		return nil, nil, nil, nil, err
	}
	b.params = params
	if err := a.checks.capBuild(t, b); err != nil { // limits.go
		return nil, nil, nil, nil, err
	}
	ms, err := a.plan(ctx, "plan-"+t.ID+"-"+c.Username, b, c.Username, nil)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := a.checks.checkQuota(ctx, c.Username, t.Team, "", ms); err != nil { // quota.go
		return nil, nil, nil, nil, err
	}
	if err := a.checks.checkBucketQuota(ctx, c.Username, t.Team, "", b.buckets); err != nil { // quota.go
		return nil, nil, nil, nil, err
	}
	return t, files, b, ms, nil
}

// planStack serves stack.plan: the machines a template revision would make, or (p.StackID)
// what an update of the stack would do.
func (a *stackAPI) planStack(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackPlanParams) (api.StackPlanResult, error) {
	if p.StackID != "" {
		return a.planUpdate(ctx, c, p) // stacks_update.go
	}
	t, _, _, ms, err := a.planTemplate(ctx, c, p)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	return api.StackPlanResult{Machines: ms, TemplateID: t.ID, Rev: t.Rev}, nil
}

// create serves stack.create: the stack and machine documents of a planned template revision.
func (a *stackAPI) create(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackPlanParams) (api.StackCreateResult, error) {
	if res, ok, err := a.claimFromPool(ctx, c, p); err != nil || ok { // pools.go
		return res, err
	}
	return a.createStack(ctx, c, p, "")
}

// createStack is stack.create's usual way: plan the template revision for c and save the stack
// and its machines, not built; pool ("" for none) is the pool it is built for (pools.go).
func (a *stackAPI) createStack(ctx context.Context, c *Caller, p *api.StackPlanParams, pool string) (api.StackCreateResult, error) {
	t, files, b, ms, err := a.planTemplate(ctx, c, p)
	if err != nil {
		return api.StackCreateResult{}, err
	}
	if len(ms) == 0 {
		return api.StackCreateResult{}, fmt.Errorf("template %s declares no machines (resources of: %s): %w", t.ID, strings.Join(a.srv.resourceTypes(), ", "), kite.ErrInvalidParams)
	}
	now := a.store.Now()
	st := model.Stack{ID: store.NewID(), Title: p.Title, Team: t.Team, Owner: c.Username, TemplateID: t.ID, TemplateRev: t.Rev,
		Files: files, Credentials: b.credIDs, Variables: b.params.public, Preset: b.params.preset,
		State: model.StackNotInitialized, Pool: pool, CreatedAt: now, UpdatedAt: now}
	if len(st.Variables) == 0 {
		st.Variables = nil
	}
	if st.SecretSealed, err = stackbuild.SealSecrets(a.store, st.ID, b.params.secret); err != nil {
		return api.StackCreateResult{}, err
	}
	if st.Title == "" {
		st.Title = t.Title
	}
	var machines []model.Machine
	for _, pm := range ms {
		m := model.Machine{ID: store.NewID(), StackID: st.ID, Label: pm.Label, Resource: pm.Resource, Index: pm.Index, Provider: pm.Provider,
			Owner: c.Username, Team: t.Team, State: provider.NotInitialized, Agent: model.Agent{Status: model.AgentNever},
			Attributes: pm.Attributes, CreatedAt: now, UpdatedAt: now}
		st.Machines = append(st.Machines, m.ID)
		machines = append(machines, m)
	}
	// The machines first: a stack document never points at machines that do not exist.
	if err := a.machines.InsertMany(ctx, machines); err != nil {
		return api.StackCreateResult{}, fmt.Errorf("save machines: %w", err)
	}
	if err := a.stacks.Insert(ctx, st); err != nil {
		return api.StackCreateResult{}, fmt.Errorf("save stack: %w", err)
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

func (s *Server) loadStack(ctx context.Context, c *Caller, id string) (*model.Stack, error) {
	st, err := s.store.Stacks().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && c != nil && st.Owner != c.Username && !c.TeamAdmin(st.Team) {
		return nil, notFound("stack", id)
	}
	if err != nil {
		return nil, err
	}
	return &st, nil
}

// apply serves stack.apply: a build (of a built stack, an update to its own files) or a
// destroy, as a job on the stack's lease.
func (a *stackAPI) apply(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackApplyParams) (_ api.JobRef, err error) {
	defer func() {
		if err != nil {
			a.log.WarnContext(ctx, "stack.apply refused", "stack", p.StackID, "by", c.Username, "destroy", p.Destroy, "err", err)
		}
	}()
	st, err := a.srv.loadStack(ctx, c, p.StackID)
	if err != nil {
		return api.JobRef{}, err
	}
	if !p.Destroy {
		if err := a.checks.checkPolicy(ctx, st.Team, fileMap(st.Files)); err != nil { // policy.go: refused before a job, never a Failed stack
			return api.JobRef{}, err
		}
		// A stack built before (Initialized, or Failed by an update) converges as an update to
		// its own files: machines terraform leaves alone keep their ids, disks and agents (a
		// no-op when nothing drifted). Its plan checks the constraints on the template's planned
		// values.
		if st.State == model.StackInitialized || a.srv.flow().FailedUpdate(ctx, st) { // stacks_update.go
			return a.reapplyUpdate(ctx, c, st)
		}
		if err := a.checkStackConstraints(ctx, st); err != nil { // constraints.go
			return api.JobRef{}, err
		}
		if err := a.checks.checkStackCap(ctx, st); err != nil { // limits.go
			return api.JobRef{}, err
		}
		release, err := a.checks.applyQuota(ctx, st) // quota.go: held until the stack is Building
		if err != nil {
			return api.JobRef{}, err
		}
		defer release()
	}
	sj := stackJob{lease: "apply", verb: "build", noun: "build", from: []string{model.StackNotInitialized, model.StackFailed}, to: model.StackBuilding}
	if p.Destroy {
		sj.verb, sj.noun, sj.from, sj.to = "destroy", "destroy", []string{model.StackNotInitialized, model.StackFailed, model.StackInitialized}, model.StackDestroying
	}
	return a.beginStackJob(ctx, c, st, sj, func(st *model.Stack, lease string) (jobSpec, error) {
		return stackApplyJob.spec(stackbuild.ApplyParams{StackID: st.ID, Destroy: p.Destroy, Lease: lease})
	})
}

// stackJob says which stack job beginStackJob starts.
type stackJob struct {
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
// job gives the job (its kind's spec, with params from the stack as it is now and the lease
// owner) or refuses (nothing changed then); the stack moves from sj.from to sj.to with the job's id (and sj.set) in
// one update, so it never shows a transitional state with another (dead) job's id, which the
// reconciler would act on; then the job starts. When something fails, the stack is rolled back
// and the lease released.
func (a *stackAPI) beginStackJob(ctx context.Context, c *Caller, st *model.Stack, sj stackJob, job func(st *model.Stack, lease string) (jobSpec, error)) (api.JobRef, error) {
	owner, release, err := a.srv.flow().TakeLease(ctx, "stack/"+st.ID, sj.lease, "stack "+st.ID+" is busy")
	if err != nil {
		return api.JobRef{}, err
	}
	if st, err = a.srv.flow().ReconcileForApply(ctx, st, owner); err != nil {
		release()
		return api.JobRef{}, err
	}
	spec, err := job(st, owner)
	if err != nil {
		release()
		return api.JobRef{}, err
	}
	id := store.NewID()
	set := sj.set
	set.State, set.Reason, set.JobID = new(sj.to), new(""), new(id)
	ok, err := a.stacks.Transition(ctx, st.ID, sj.from, set)
	if err != nil || !ok {
		release()
		if err != nil {
			return api.JobRef{}, err
		}
		return api.JobRef{}, fmt.Errorf("stack %s is %s; it can %s only from %s: %w", st.ID, st.State, sj.verb, strings.Join(sj.from, ", "), kite.ErrState)
	}
	if _, err := a.srv.startJob(ctx, id, spec, "stack/"+st.ID, c.Username); err != nil {
		back := store.StackSet{State: new(st.State), Reason: new(fmt.Sprintf("could not start the %s job: %v", sj.noun, err))}
		if st.JobID != "" {
			back.JobID = new(st.JobID)
		}
		rerr := a.store.Persist(ctx, "roll back stack "+st.ID, 0, func(ctx context.Context) error {
			_, err := a.stacks.TransitionOfJob(ctx, st.ID, []string{sj.to}, id, back)
			return err
		})
		if rerr != nil {
			a.log.ErrorContext(ctx, "roll back stack after a job that did not start (the reconciler will)", "stack", st.ID, "err", rerr)
		}
		release()
		return api.JobRef{}, err
	}
	return api.JobRef{JobID: id}, nil
}

// kloudURLFor is the URL a provider's machines reach kloud at.
func (s *Server) kloudURLFor(p *provider.Provider) string {
	if p.KloudURL != nil {
		return p.KloudURL(s.opts.PublicURL)
	}
	return s.opts.PublicURL
}

// describe serves stack.describe: the stack with its machines.
func (a *stackAPI) describe(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackRef) (api.StackView, error) {
	st, err := a.srv.loadStack(ctx, c, p.StackID)
	if err != nil {
		return api.StackView{}, err
	}
	ms, err := a.srv.flow().StackMachines(ctx, st.ID)
	if err != nil {
		return api.StackView{}, err
	}
	a.srv.flow().FillLatestRev(ctx, []*model.Stack{st})
	return api.StackView{Stack: *st, MachineDocs: ms, Resets: st.Resets}, nil
}

// list serves stack.list: the caller's stacks, or (p.All) a team's or every one.
func (a *stackAPI) list(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackListParams) (api.StackListResult, error) {
	f := store.StackFilter{Owner: c.Username, Team: p.Team}
	if p.All {
		switch {
		case p.Team != "" && c.TeamAdmin(p.Team):
			f.Owner = ""
		case p.Team == "" && c.Admin:
			f = store.StackFilter{All: true}
		default:
			return api.StackListResult{}, fmt.Errorf("listing every member's stacks needs a team admin: %w", kite.ErrPermission)
		}
	}
	sts, err := a.stacks.List(ctx, f)
	if err != nil {
		return api.StackListResult{}, err
	}
	a.srv.flow().FillLatestRev(ctx, stackPtrs(sts))
	return api.StackListResult{Stacks: sts}, nil
}

// stateResources yields every resource instance of st (stackbuild.StateResources).
func stateResources(st *tfjson.State) iter.Seq[*tfjson.StateResource] {
	return stackbuild.StateResources(st)
}

// stateEmpty reports whether a terraform state holds no resources (stackbuild.StateEmpty).
func stateEmpty(st *tfjson.State) bool { return stackbuild.StateEmpty(st) }
