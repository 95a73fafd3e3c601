package kloud

import (
	"context"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// The build flow's dependencies: kloud/stackbuild runs build, destroy and reconcile; what it
// needs of kloud it gets through stackbuild.Deps, filled here.

// flow is the build flow (kloud/stackbuild) over this server's store, terraformer, providers
// and kontrol: handlers check who and what, call it, and answer. It is built once, in New.
func (s *Server) flow() *stackbuild.Flow { return s.build }

// newFlow builds the flow; New calls it once the area APIs it reaches are set.
func newFlow(s *Server) *stackbuild.Flow {
	return stackbuild.New(stackbuild.Deps{
		Store: s.store,
		Terraformer: func() (stackbuild.Terraformer, error) {
			tf, err := s.terraformer()
			if err != nil {
				return nil, err
			}
			return tf, nil
		},
		Providers: s.providers,
		Kontrol:   s.Kontrol,
		Policy:    buildDeps{s},
		Callers:   buildDeps{s},
		Templates: s.stacks, // stacks.go: build; stacks_update.go: PlanFiles
		Plans:     s.stacks,
		Quota:     buildDeps{s},
		Machines:  buildDeps{s},
		Agents: stackbuild.AgentSource{URL: s.kloudURLFor, PublicURL: s.opts.PublicURL, KlientSum: s.klientSum, KlientBin: s.opts.KlientBin,
			CACert: s.opts.CACert},
		Planner:  s.planner,
		JobLease: s.opts.JobLease,
		Log:      s.log,
	})
}

// buildDeps are the checks of kloud's that the build flow asks for (stackbuild.Deps).
type buildDeps struct{ s *Server }

// CheckDestroy is policy.go's checkDestroyPolicy.
func (d buildDeps) CheckDestroy(ctx context.Context, team string, files map[string][]byte) error {
	return d.s.checkDestroyPolicy(ctx, team, files)
}

// Callers, Quota, Machines: the hooks of stackbuild.Deps (its Templates and Plans are the
// stackAPI's, below).

// Caller is callerByName (not as an administrator).
func (d buildDeps) Caller(ctx context.Context, username string) (stackbuild.Caller, error) {
	return d.s.callerByName(ctx, username, false)
}

// Hold is holdQuota (quota.go).
func (d buildDeps) Hold(ctx context.Context, owner, team string) (release func(), err error) {
	return d.s.holdQuota(ctx, owner, team)
}

// CheckBuckets is quota.Keeper.CheckBuckets of st's claims.
func (d buildDeps) CheckBuckets(ctx context.Context, st *model.Stack, want []model.BucketClaim) error {
	return d.s.quotas().CheckBuckets(ctx, st.Owner, st.Team, st.ID, want)
}

// ProviderMachine is providerMachine.
func (d buildDeps) ProviderMachine(ctx context.Context, c stackbuild.Caller, m *model.Machine) (provider.Machine, error) {
	cc, _ := c.(*Caller)
	return d.s.providerMachine(ctx, cc, m)
}

// CanInfo reports whether provider name answers machine.info.
func (d buildDeps) CanInfo(name string) bool {
	return d.s.capable(name, api.MethodMachineInfo, provider.CapInfo) == nil
}

// SetAgent is setAgent.
func (d buildDeps) SetAgent(ctx context.Context, kiteID, status, version string) {
	d.s.setAgent(ctx, kiteID, status, version)
}

// DeliverBuckets is the bucket API's deliver (buckets.go).
func (d buildDeps) DeliverBuckets(ctx context.Context, j stackbuild.Job, st *model.Stack) {
	d.s.buckets.deliver(ctx, j, st)
}

// KeepPorts is keepPorts (ports.go).
func (d buildDeps) KeepPorts(ctx context.Context, j stackbuild.Job, st *model.Stack) {
	d.s.keepPorts(ctx, j, st)
}

// Template is build: the files' credentials and variables resolved, the policy checked
// (stackbuild.Templates).
func (a *stackAPI) Template(ctx context.Context, c stackbuild.Caller, team string, files map[string][]byte, credIDs, vars map[string]string, also ...string) (*stackbuild.Built, error) {
	cc, _ := c.(*Caller)
	b, err := a.build(ctx, cc, team, files, credIDs, vars, also...)
	if err != nil {
		return nil, err
	}
	return &stackbuild.Built{Files: b.files, Config: b.cfg, Variables: b.variables, Creds: b.creds, Providers: b.providers, Buckets: b.buckets}, nil
}

// PlanContext is planCtx (limits.go: the plan timeout; stackbuild.Plans, with PlanFiles in
// stacks_update.go).
func (a *stackAPI) PlanContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return a.checks.planCtx(ctx)
}

// PlanStopped is planStopped (limits.go; stackbuild.Plans).
func (a *stackAPI) PlanStopped(ctx context.Context) error { return a.checks.planStopped(ctx) }

// CallerName is the caller's user name (stackbuild.Caller).
func (c *Caller) CallerName() string { return c.Username }

// Doc is the job's document (stackbuild.Job).
func (j *jobCtx) Doc() store.Job { return j.Job }
