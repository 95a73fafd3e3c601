package kloud

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// Plans as durable jobs (issue 19): stack.planJob takes stack.plan's params and answers at once
// with a job (kind stack.plan) whose result is what stack.plan answers (api.StackPlanResult),
// with progress and terraform's lines in its log, followed with job.watch and stopped with
// job.cancel (terraform is cancelled and killed, as at the plan timeout). What can be refused
// without terraform is refused at the call, before any job: a template the caller may not use,
// files the policy rejects, a missing credential, more machines than the cap (the 100,000-machine
// template), and a user may have at most MaxPlanJobsPerUser plan jobs running (-32004 beyond).
// The CLI (`kloud stack plan`, `kloud stack update`'s plan) and the web UI plan this way; the
// synchronous stack.plan stays for API clients that want one answer and older CLIs.

// jobStackPlan is the kind of stack.planJob's jobs.
const jobStackPlan = "stack.plan"

// MaxPlanJobsPerUser is how many plan jobs one user may have running at once (in one kloud
// process): each runs terraform, or waits for the plan of the same template before it.
const MaxPlanJobsPerUser = 4

// planSlots counts each user's running plan jobs.
type planSlots struct {
	mu sync.Mutex
	n  map[string]int
}

// take counts one more plan job of user, unless they have limit running.
func (p *planSlots) take(user string, limit int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == nil {
		p.n = map[string]int{}
	}
	if p.n[user] >= limit {
		return false
	}
	p.n[user]++
	return true
}

// done counts one plan job of user less.
func (p *planSlots) done(user string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[user]--; p.n[user] <= 0 {
		delete(p.n, user)
	}
}

// planJobParams are a plan job's params: the call's, and whether its caller was an
// administrator by their key (the job acts as its owner).
type planJobParams struct {
	Plan  api.StackPlanParams `json:"plan"`
	Admin bool                `json:"admin,omitempty"`
	// Sealed holds the values of sensitive parameters, taken out of Plan, sealed (the store's
	// Seal, bound to the owner): a job's params are shown by job.get (params.go).
	Sealed []byte `json:"sealed,omitempty"`
}

// planStackJob serves stack.planJob: stack.plan as a job (runPlanJob), refused at the call
// when it can be without terraform.
func (a *stackAPI) planStackJob(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackPlanParams) (api.JobRef, error) {
	var target string
	var sealed []byte
	if p.StackID != "" {
		st, err := a.srv.loadStack(ctx, c, p.StackID)
		if err != nil {
			return api.JobRef{}, err
		}
		if st.State != model.StackInitialized && st.State != model.StackFailed {
			return api.JobRef{}, fmt.Errorf("stack %s is %s: an update can be planned for a built stack (Initialized or Failed): %w", st.ID, st.State, kite.ErrState)
		}
		target = "stack/" + st.ID
	} else {
		t, files, err := a.templateFiles(ctx, c, p)
		if err != nil {
			return api.JobRef{}, err
		}
		params, err := a.srv.resolveParams(fileMap(files), p) // params.go
		if err != nil {
			return api.JobRef{}, err
		}
		if len(params.secret) > 0 {
			if sealed, err = a.sealSecretParams(p, params.secret, c.Username); err != nil {
				return api.JobRef{}, err
			}
		}
		b, err := a.build(ctx, c, t.Team, fileMap(files), p.Credentials, params.all())
		if err != nil {
			return api.JobRef{}, err
		}
		if err := a.checks.capBuild(t, b); err != nil { // limits.go: before terraform, before a job
			return api.JobRef{}, err
		}
		target = "template/" + t.ID
	}
	if !a.planJobs.take(c.Username, MaxPlanJobsPerUser) { // released when the job ends (runPlanJob)
		return api.JobRef{}, fmt.Errorf("%s has %d plans running, the most a user may have at once: wait for one to end, or cancel it (kloud job list; kloud job cancel ID): %w",
			c.Username, MaxPlanJobsPerUser, kite.ErrConflict)
	}
	id, err := a.startPlanJob(ctx, target, c.Username, planJobParams{Plan: *p, Admin: c.Admin, Sealed: sealed})
	if err != nil {
		a.planJobs.done(c.Username)
		return api.JobRef{}, err
	}
	return api.JobRef{JobID: id}, nil
}

// startPlanJob starts a plan job on target for owner (planJob.Start, through the Server's
// startJob).
func (a *stackAPI) startPlanJob(ctx context.Context, target, owner string, p planJobParams) (string, error) {
	spec, err := planJob.spec(p)
	if err != nil {
		return "", err
	}
	return a.srv.startJob(ctx, "", spec, target, owner)
}

// runPlanJob is a plan job: stack.plan's work as the job's owner, terraform's lines in the
// job's log. Its context is the job's: job.cancel and the plan timeout stop terraform.
func (a *stackAPI) runPlanJob(ctx context.Context, j *jobCtx, p planJobParams) (api.StackPlanResult, error) {
	defer a.planJobs.done(j.Owner) // taken by planStackJob
	c, err := a.srv.callerByName(ctx, j.Owner, p.Admin)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	if err := a.openSecretParams(&p, j.Owner); err != nil {
		return api.StackPlanResult{}, err
	}
	what := "template " + p.Plan.TemplateID
	if p.Plan.StackID != "" {
		what = "an update of stack " + p.Plan.StackID
	}
	j.Progress(ctx, 10, "Planning", "terraform plan of "+what)
	ctx = withPlanLog(ctx, func(line string) { j.Logf(ctx, "%s", line) })
	r, err := a.planStack(ctx, c, nil, &p.Plan)
	if err != nil {
		return api.StackPlanResult{}, err
	}
	j.Progress(ctx, 100, "Planned", fmt.Sprintf("%d machines", len(r.Machines)))
	return r, nil
}

type planLogKey struct{}

// withPlanLog makes the plans made with ctx (plan) send terraform's lines to f.
func withPlanLog(ctx context.Context, f func(string)) context.Context {
	return context.WithValue(ctx, planLogKey{}, f)
}

// planLog is the function withPlanLog put in ctx, or nil.
func planLog(ctx context.Context) func(string) {
	f, _ := ctx.Value(planLogKey{}).(func(string))
	return f
}

// sealSecretParams takes the sensitive parameters (secret, in -var form) out of p and returns
// them sealed for owner's plan job.
func (a *stackAPI) sealSecretParams(p *api.StackPlanParams, secret map[string]string, owner string) ([]byte, error) {
	b, err := json.Marshal(secret)
	if err != nil {
		return nil, err
	}
	sealed, err := a.store.Seal(b, []byte("planjob/"+owner))
	if err != nil {
		return nil, err
	}
	q := *p
	q.Parameters, q.Variables = maps.Clone(p.Parameters), maps.Clone(p.Variables)
	for k := range secret {
		delete(q.Parameters, k)
		delete(q.Variables, k)
	}
	*p = q
	return sealed, nil
}

// openSecretParams puts the sealed sensitive parameters of a plan job back into its plan, as
// variables in -var form.
func (a *stackAPI) openSecretParams(p *planJobParams, owner string) error {
	if len(p.Sealed) == 0 {
		return nil
	}
	b, err := a.store.Open(p.Sealed, []byte("planjob/"+owner))
	if err != nil {
		return fmt.Errorf("open the plan's sensitive parameters: %w", err)
	}
	var secret map[string]string
	if err := json.Unmarshal(b, &secret); err != nil {
		return fmt.Errorf("the plan's sensitive parameters: %w", err)
	}
	if p.Plan.Variables == nil {
		p.Plan.Variables = map[string]string{}
	}
	maps.Copy(p.Plan.Variables, secret)
	return nil
}
