package kloud

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	kmetrics "github.com/kloud-dev/kloud/kloud/metrics"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/quota"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Metrics (issue 19): GET /metrics in Prometheus' text format, from a registry of this server's
// own (never the global one). On kloud's main address it is for kloud administrators (a session
// or the kite key of an admin, like the terminal routes: "Authorization: Bearer <key>"); with
// Options.MetricsAddr (kloud serve --metrics-addr) it is also served without authentication on
// that separate listener, for a Prometheus on a private network. The collectors and the poller
// of the machines' figures and quota use are package kloud/metrics; kloud builds them here
// (metricsDeps: kloud's machines, agents, quota accounting and kontrol's kites as the poller's
// small interfaces), runs the poller as a background task (routes.go) and serves the route.
// docs/operations.md "Metrics" lists every metric.

// DefaultMetricsInterval is Options.MetricsInterval's default.
const DefaultMetricsInterval = kmetrics.DefaultInterval

// kloudMetrics are a server's collectors (kloud/metrics) and, once the server is built, their
// poller.
type kloudMetrics struct {
	*kmetrics.Collectors
	poller *kmetrics.Poller
}

func newKloudMetrics() *kloudMetrics { return &kloudMetrics{Collectors: kmetrics.NewCollectors()} }

// storeCommand is the store's Options.OnCommand.
func (m *kloudMetrics) storeCommand(name string, d time.Duration, failed bool) {
	m.StoreCommand(name, d, failed)
}

// jobStarted and jobEnded move the job metrics (jobRunner.run); the state is the one Jobs.Finish
// records for err.
func (m *kloudMetrics) jobStarted(kind string) { m.JobStarted(kind) }

func (m *kloudMetrics) jobEnded(kind string, err error, d time.Duration) {
	state := string(store.JobSucceeded)
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled) || errors.Is(err, store.ErrJobCancelled):
		state = string(store.JobCancelled)
	default:
		state = string(store.JobFailed)
	}
	m.JobEnded(kind, state, d)
}

// plannerObserve is the planners' Observe.
func (m *kloudMetrics) plannerObserve(r *stackbuild.AgentResult, d time.Duration) {
	if r == nil {
		m.PlannerWaiting()
		return
	}
	m.PlannerWaited(r.OK, d)
}

// Run is the poller's background task: the machines' figures and quota use, every
// Options.MetricsInterval until ctx ends.
func (m *kloudMetrics) Run(ctx context.Context) { m.poller.Run(ctx) }

// planner is the planner of builds and starts, with the server's timeout, log and metrics.
func (s *Server) planner() *stackbuild.Planner {
	return &stackbuild.Planner{Agents: kontrolAgents{k: s.Kontrol, s: s}, Timeout: s.opts.AgentTimeout, Log: s.log, Observe: s.metrics.plannerObserve}
}

// newMetricsPoller registers the components' gauges (kite connections, registered kites, web
// terminal sessions) and builds the poller. New calls it once the components exist.
func newMetricsPoller(s *Server) error {
	d := metricsDeps{s}
	p, err := kmetrics.New(kmetrics.Options{Collectors: s.metrics.Collectors, Machines: d, Agents: d, Quotas: d,
		Kite: s.Kite, Kites: d, Sessions: s.relay.Sessions, Interval: s.opts.MetricsInterval, Logger: s.log})
	if err != nil {
		return err
	}
	s.metrics.poller = p
	return nil
}

// metricsDeps is kloud as the metrics poller's Machines, Agents, Quotas and Kites.
type metricsDeps struct{ s *Server }

func (d metricsDeps) All(ctx context.Context) ([]model.Machine, error) {
	return d.s.store.Machines().List(ctx, store.MachineFilter{All: true})
}

func (d metricsDeps) Agent(kiteID string) kmetrics.Agent {
	if c := d.s.Kontrol.Conn(kiteID); c != nil {
		return c
	}
	return nil
}

func (d metricsDeps) Registered() map[string]int {
	n := map[string]int{}
	for _, k := range d.s.Kontrol.Lookup(kite.Identity{}) {
		switch {
		case strings.HasPrefix(k.Kite.ID, AgentKitePrefix):
			n["agent"]++
		case strings.HasPrefix(k.Kite.ID, kitekey.PluginIDPrefix):
			n["plugin"]++
		default:
			n["other"]++
		}
	}
	return n
}

// Use computes what every user and team holds (quota.Keeper.Held: a stack's machines but
// terminated ones, nothing of a stack never built; and the stacks' bucket claims) from one list
// of stacks, the machines, the claims and the quotas (the limits as quota.Keeper reads them):
// four queries whatever the number of stacks.
func (d metricsDeps) Use(ctx context.Context, ms []model.Machine) (use, limits map[string]api.Quota, err error) {
	s := d.s
	sts, err := s.store.Stacks().List(ctx, store.StackFilter{All: true})
	if err != nil {
		return nil, nil, err
	}
	byStack := map[string][]model.Machine{}
	for _, m := range ms {
		byStack[m.StackID] = append(byStack[m.StackID], m)
	}
	use = map[string]api.Quota{}
	keeper := s.quotas()
	for _, st := range sts {
		held := keeper.Held(&st, byStack[st.ID])
		for _, sub := range quotaSubjects(st.Owner, st.Team) {
			use[sub] = addQuota(use[sub], held)
		}
	}
	// Bucket claims count for their owner and team whatever their stack's state.
	ids := make([]string, 0, len(sts))
	for _, st := range sts {
		ids = append(ids, st.ID)
	}
	claims, err := s.store.BucketClaims().ByStacks(ctx, ids)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range claims {
		for _, sub := range quotaSubjects(c.Owner, c.Team) {
			use[sub] = addQuota(use[sub], api.Quota{Buckets: 1, BucketMB: quota.ClaimMB(c)})
		}
	}
	// Subjects with a quota show it (and their use, 0 without stacks); users with stacks but
	// no quota of their own show the default quota.
	qs, err := s.store.Quotas().List(ctx)
	if err != nil {
		return nil, nil, err
	}
	limits = map[string]api.Quota{}
	for _, q := range qs {
		limits[q.ID] = quota.FromStore(q)
		use[q.ID] = use[q.ID]
	}
	for sub := range use {
		if _, ok := limits[sub]; !ok && strings.HasPrefix(sub, "user/") {
			limits[sub] = s.opts.DefaultQuota
		}
	}
	return use, limits, nil
}

// serveMetrics is GET /metrics on kloud's main address: kloud administrators only.
func (o *opsAPI) serveMetrics(w http.ResponseWriter, r *http.Request) {
	c, err := o.httpCaller(r)
	if err != nil {
		o.writeErr(w, err)
		return
	}
	if !c.Admin {
		writeError(w, http.StatusForbidden, "/metrics is for kloud administrators (or serve it on a private address with kloud serve --metrics-addr)")
		return
	}
	o.metrics.ServeHTTP(w, r)
}

// MetricsHandler serves the metrics without authentication (the --metrics-addr listener).
func (s *Server) MetricsHandler() http.Handler { return s.metrics.Handler() }
