package kloud

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kloud-dev/kloud/internal/metrics"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Metrics (issue 19): GET /metrics in Prometheus' text format, from a registry of this server's
// own (never the global one). On kloud's main address it is for kloud administrators (a session
// or the kite key of an admin, like the terminal routes: "Authorization: Bearer <key>"); with
// Options.MetricsAddr (kloud serve --metrics-addr) it is also served without authentication on
// that separate listener, for a Prometheus on a private network. Each component's metrics are
// defined here and moved by the component (jobs.go, kloud/relay, the planner, the store's command
// monitor, the kite's Observer); the machines' figures (what their klient reports in
// kite.systemInfo: cores, load, memory, disk) and the quota use are polled every
// Options.MetricsInterval by a background task (pollMetrics), never on scrape, so a scrape costs
// no store query and no call to a machine. docs/operations.md "Metrics" lists every metric.

// DefaultMetricsInterval is Options.MetricsInterval's default.
const DefaultMetricsInterval = 15 * time.Second

// machineInfoTimeout bounds one agent's kite.systemInfo call in a poll; machinePollers is how
// many agents are asked at once.
const (
	machineInfoTimeout = 5 * time.Second
	machinePollers     = 8
)

// kloudMetrics are a server's collectors.
type kloudMetrics struct {
	reg     *prometheus.Registry
	handler http.Handler // reg in Prometheus' format
	kite    *metrics.Kite

	jobsRunning  *prometheus.GaugeVec
	jobsFinished *prometheus.CounterVec
	jobDuration  *prometheus.HistogramVec

	plannerWaiting prometheus.Gauge
	plannerWait    *prometheus.HistogramVec

	termBytes *prometheus.CounterVec

	storeDuration *prometheus.HistogramVec
	storeFailures *prometheus.CounterVec

	machineInfoFailures prometheus.Counter
	polled              *snapshot // machines' figures and quota use, replaced by each poll
}

func newKloudMetrics() *kloudMetrics {
	reg := metrics.NewRegistry()
	m := &kloudMetrics{
		reg:  reg,
		kite: metrics.NewKite(reg, "kloud"),
		jobsRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kloud", Name: "jobs_running", Help: "Durable jobs this kloud runs now, by kind.",
		}, []string{"kind"}),
		jobsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kloud", Name: "jobs_finished_total", Help: "Durable jobs ended by this kloud, by kind and state (succeeded, failed, cancelled).",
		}, []string{"kind", "state"}),
		jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kloud", Name: "job_duration_seconds", Help: "How long durable jobs ran in this kloud, by kind and final state.",
			Buckets: metrics.LongBuckets,
		}, []string{"kind", "state"}),
		plannerWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kloud", Name: "planner_waiting_agents", Help: "Machine agents the planner waits for now (registration, ping, provisioning).",
		}),
		plannerWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kloud", Name: "planner_wait_seconds", Help: "How long the planner waited for a machine's agent, by result (ok, failed).",
			Buckets: metrics.LongBuckets,
		}, []string{"result"}),
		termBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kloud", Name: "terminal_bytes_total", Help: "Web terminal bytes relayed, by direction (in: browser to machine, out: machine to browser).",
		}, []string{"direction"}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kloud", Name: "store_command_duration_seconds", Help: "Latency of the store's database commands, by operation (find, update, insert, ...).",
			Buckets: metrics.RPCBuckets,
		}, []string{"operation"}),
		storeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kloud", Name: "store_command_failures_total", Help: "Database commands that failed, by operation.",
		}, []string{"operation"}),
		machineInfoFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kloud", Name: "machine_info_failures_total", Help: "Connected agents that did not answer kite.systemInfo in a metrics poll.",
		}),
		polled: newSnapshot(),
	}
	for _, d := range []string{"in", "out"} {
		m.termBytes.WithLabelValues(d)
	}
	m.handler = metrics.Handler(reg)
	reg.MustRegister(m.jobsRunning, m.jobsFinished, m.jobDuration, m.plannerWaiting, m.plannerWait,
		m.termBytes, m.storeDuration, m.storeFailures, m.machineInfoFailures, m.polled)
	return m
}

// storeCommand is the store's Options.OnCommand.
func (m *kloudMetrics) storeCommand(name string, d time.Duration, failed bool) {
	m.storeDuration.WithLabelValues(name).Observe(d.Seconds())
	if failed {
		m.storeFailures.WithLabelValues(name).Inc()
	}
}

// jobStarted and jobEnded move the job metrics (runJob); the state is the one Jobs.Finish
// records for err.
func (m *kloudMetrics) jobStarted(kind string) { m.jobsRunning.WithLabelValues(kind).Inc() }

func (m *kloudMetrics) jobEnded(kind string, err error, d time.Duration) {
	state := string(store.JobSucceeded)
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled) || errors.Is(err, store.ErrJobCancelled):
		state = string(store.JobCancelled)
	default:
		state = string(store.JobFailed)
	}
	m.jobsRunning.WithLabelValues(kind).Dec()
	m.jobsFinished.WithLabelValues(kind, state).Inc()
	m.jobDuration.WithLabelValues(kind, state).Observe(d.Seconds())
}

// plannerObserve is the planners' Observe.
func (m *kloudMetrics) plannerObserve(r *stackbuild.AgentResult, d time.Duration) {
	if r == nil {
		m.plannerWaiting.Inc()
		return
	}
	m.plannerWaiting.Dec()
	result := "ok"
	if !r.OK {
		result = "failed"
	}
	m.plannerWait.WithLabelValues(result).Observe(d.Seconds())
}

// planner is the planner of builds and starts, with the server's timeout, log and metrics.
func (s *Server) planner() *stackbuild.Planner {
	return &stackbuild.Planner{Agents: kontrolAgents{s.Kontrol}, Timeout: s.opts.AgentTimeout, Log: s.log, Observe: s.metrics.plannerObserve}
}

// watchComponents registers the gauges read from the components at scrape time: kite
// connections, registered kites, web terminal sessions. New calls it once they exist.
func (s *Server) watchComponents() {
	s.metrics.kite.Watch(s.Kite)
	s.metrics.reg.MustRegister(
		&funcCollector{desc: prometheus.NewDesc("kloud_kontrol_registered_kites",
			"Kites registered with kloud's kontrol now, by kind (agent: a machine's klient; plugin: a provider plugin; other).", []string{"kind"}, nil),
			collect: func(emit func(v float64, labels ...string)) {
				n := map[string]int{"agent": 0, "plugin": 0, "other": 0}
				for _, k := range s.Kontrol.Lookup(kite.Identity{}) {
					switch {
					case strings.HasPrefix(k.Kite.ID, AgentKitePrefix):
						n["agent"]++
					case strings.HasPrefix(k.Kite.ID, kitekey.PluginIDPrefix):
						n["plugin"]++
					default:
						n["other"]++
					}
				}
				for kind, v := range n {
					emit(float64(v), kind)
				}
			}},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kloud", Name: "terminal_sessions", Help: "Web terminals relayed by this kloud now."},
			func() float64 { return float64(s.relay.Sessions()) }),
	)
}

// funcCollector emits one gauge family computed at scrape time.
type funcCollector struct {
	desc    *prometheus.Desc
	collect func(emit func(v float64, labels ...string))
}

func (c *funcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *funcCollector) Collect(ch chan<- prometheus.Metric) {
	c.collect(func(v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, labels...)
	})
}

// serveMetrics is GET /metrics on kloud's main address: kloud administrators only.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	c, err := s.httpCaller(r)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	if !c.Admin {
		writeError(w, http.StatusForbidden, "/metrics is for kloud administrators (or serve it on a private address with kloud serve --metrics-addr)")
		return
	}
	s.metrics.handler.ServeHTTP(w, r)
}

// MetricsHandler serves the metrics without authentication (the --metrics-addr listener).
func (s *Server) MetricsHandler() http.Handler { return s.metrics.handler }

// snapshot is the polled gauges: each poll replaces them whole, so a machine that went away or
// a subject without stacks disappears from the next scrape.
type snapshot struct {
	mu      sync.Mutex
	metrics []prometheus.Metric
	descs   []*prometheus.Desc
}

// The polled gauges. Machine figures are labelled by machine id and owner (the only per-object
// labels kloud exports); quota gauges by subject (user/NAME, team/SLUG) and resource (machines,
// cores, memory_bytes, disk_bytes).
var (
	descMachineCPUs        = prometheus.NewDesc("kloud_machine_cpus", "Processors a machine's klient reports.", []string{"machine", "owner"}, nil)
	descMachineLoad1       = prometheus.NewDesc("kloud_machine_load1", "A machine's 1-minute load average, as its klient reports it.", []string{"machine", "owner"}, nil)
	descMachineMemUsed     = prometheus.NewDesc("kloud_machine_memory_used_bytes", "Memory in use on a machine (total - free - buffers), as its klient reports it.", []string{"machine", "owner"}, nil)
	descMachineMemTotal    = prometheus.NewDesc("kloud_machine_memory_total_bytes", "A machine's memory, as its klient reports it.", []string{"machine", "owner"}, nil)
	descMachineDiskUsed    = prometheus.NewDesc("kloud_machine_disk_used_bytes", "Disk in use on a machine's root file system, as its klient reports it.", []string{"machine", "owner"}, nil)
	descMachineDiskTotal   = prometheus.NewDesc("kloud_machine_disk_total_bytes", "Size of a machine's root file system, as its klient reports it.", []string{"machine", "owner"}, nil)
	descQuotaUsed          = prometheus.NewDesc("kloud_quota_used", "What a user's or team's stacks hold, by resource (machines, cores, memory_bytes, disk_bytes).", []string{"subject", "resource"}, nil)
	descQuotaLimit         = prometheus.NewDesc("kloud_quota_limit", "A user's or team's quota, by resource (0: no limit).", []string{"subject", "resource"}, nil)
	descMetricsPollSeconds = prometheus.NewDesc("kloud_metrics_poll_timestamp_seconds", "When the machines' figures and quota use were last polled (Unix time).", nil, nil)
)

func newSnapshot() *snapshot {
	return &snapshot{descs: []*prometheus.Desc{descMachineCPUs, descMachineLoad1, descMachineMemUsed, descMachineMemTotal,
		descMachineDiskUsed, descMachineDiskTotal, descQuotaUsed, descQuotaLimit, descMetricsPollSeconds}}
}

func (sn *snapshot) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range sn.descs {
		ch <- d
	}
}

func (sn *snapshot) Collect(ch chan<- prometheus.Metric) {
	sn.mu.Lock()
	ms := sn.metrics
	sn.mu.Unlock()
	for _, m := range ms {
		ch <- m
	}
}

func (sn *snapshot) set(ms []prometheus.Metric) {
	sn.mu.Lock()
	sn.metrics = ms
	sn.mu.Unlock()
}

// pollMetrics refreshes the polled gauges at once, then every Options.MetricsInterval, until
// ctx ends.
func (s *Server) pollMetrics(ctx context.Context) {
	t := time.NewTicker(s.opts.MetricsInterval)
	defer t.Stop()
	for {
		s.PollMetrics(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PollMetrics refreshes the machines' figures and the quota use once (the background task does
// it every Options.MetricsInterval; tests call it to not wait).
func (s *Server) PollMetrics(ctx context.Context) {
	var out []prometheus.Metric
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...))
	}
	ms, err := s.store.Machines().List(ctx, store.MachineFilter{All: true})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("metrics: list machines", "err", err)
		}
		return // keep the last figures: a store outage shows in the store metrics and /readyz
	}
	s.pollMachines(ctx, ms, gauge)
	if err := s.pollQuotas(ctx, ms, gauge); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("metrics: quota use", "err", err)
		}
		return
	}
	gauge(descMetricsPollSeconds, float64(time.Now().UnixNano())/1e9)
	s.metrics.polled.set(out)
}

// pollMachines asks every connected agent for kite.systemInfo (machinePollers at a time, each
// within machineInfoTimeout).
func (s *Server) pollMachines(ctx context.Context, ms []Machine, gauge func(*prometheus.Desc, float64, ...string)) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, machinePollers)
	for i := range ms {
		m := &ms[i]
		if m.KiteID == "" {
			continue
		}
		c := s.Kontrol.Conn(m.KiteID)
		if c == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			cctx, cancel := context.WithTimeout(ctx, machineInfoTimeout)
			defer cancel()
			var si kite.SystemInfo
			if err := c.Call(cctx, "kite.systemInfo", nil, &si); err != nil {
				s.metrics.machineInfoFailures.Inc()
				s.log.Debug("metrics: machine info", "machine", m.ID, "err", err)
				return
			}
			load1 := 0.0
			if len(si.Load) > 0 {
				load1 = si.Load[0]
			}
			mu.Lock()
			defer mu.Unlock()
			gauge(descMachineCPUs, float64(si.NumCPU), m.ID, m.Owner)
			gauge(descMachineLoad1, load1, m.ID, m.Owner)
			gauge(descMachineMemUsed, float64(si.MemoryUsage), m.ID, m.Owner)
			gauge(descMachineMemTotal, float64(si.MemoryTotal), m.ID, m.Owner)
			gauge(descMachineDiskUsed, float64(si.DiskUsage), m.ID, m.Owner)
			gauge(descMachineDiskTotal, float64(si.DiskTotal), m.ID, m.Owner)
		}()
	}
	wg.Wait()
}

// pollQuotas computes what every user and team holds (the rule of quotaUse: a stack's machines
// but terminated ones, nothing of a stack never built) from one list of stacks, the machines and
// the quotas (the rule of quotaOf for the limits): three queries whatever the number of stacks.
func (s *Server) pollQuotas(ctx context.Context, ms []Machine, gauge func(*prometheus.Desc, float64, ...string)) error {
	sts, err := s.store.Stacks().List(ctx, store.StackFilter{All: true})
	if err != nil {
		return err
	}
	byStack := map[string][]Machine{}
	for _, m := range ms {
		byStack[m.StackID] = append(byStack[m.StackID], m)
	}
	use := map[string]api.Quota{}
	for _, st := range sts {
		held := s.machinesHeld(&st, byStack[st.ID])
		for _, sub := range quotaSubjects(st.Owner, st.Team) {
			use[sub] = addQuota(use[sub], held)
		}
	}
	// Subjects with a quota show it (and their use, 0 without stacks); users with stacks but
	// no quota of their own show the default quota.
	qs, err := s.store.Quotas().List(ctx)
	if err != nil {
		return err
	}
	limits := map[string]api.Quota{}
	for _, q := range qs {
		limits[q.ID] = api.Quota{Machines: q.Machines, Cores: q.Cores, MemoryMB: q.MemoryMB, DiskMB: q.DiskMB}
		use[q.ID] = use[q.ID]
	}
	for sub, u := range use {
		limit, ok := limits[sub]
		if !ok && strings.HasPrefix(sub, "user/") {
			limit = s.opts.DefaultQuota
		}
		for _, q := range []struct {
			d *prometheus.Desc
			v api.Quota
		}{{descQuotaUsed, u}, {descQuotaLimit, limit}} {
			gauge(q.d, float64(q.v.Machines), sub, "machines")
			gauge(q.d, q.v.Cores, sub, "cores")
			gauge(q.d, float64(q.v.MemoryMB)*(1<<20), sub, "memory_bytes")
			gauge(q.d, float64(q.v.DiskMB)*(1<<20), sub, "disk_bytes")
		}
	}
	return nil
}

// machinesHeld is what stack st with machines ms holds of its owner's and team's quotas (see
// stackHeld).
func (s *Server) machinesHeld(st *Stack, ms []Machine) api.Quota {
	var held api.Quota
	if st.State == StackNotInitialized {
		return held
	}
	for _, m := range ms {
		if m.State != provider.Terminated {
			held = addQuota(held, s.machineNeed(m.Provider, m.Attributes))
		}
	}
	return held
}
