// Package metrics is kloud's Prometheus metrics (issue 19): the collectors of a server, in a
// registry of its own (never the global one), and the poller of the machines' figures and the
// quota use.
//
// Each component's metrics are defined here and moved by the component (kloud's jobs, kloud/relay,
// the planner, the store's command monitor, the kite's Observer); the components' gauges (kite
// connections, registered kites, web terminal sessions) are read at scrape time; the machines'
// figures (what their klient reports in kite.systemInfo: cores, load, memory, disk) and the
// quota use are polled every interval by a background task ([Poller.Run]), never on scrape, so a
// scrape costs no store query and no call to a machine. docs/operations.md "Metrics" lists every
// metric.
//
// The package never imports kloud: the poller gets what it needs through the small interfaces of
// [Options] (kloud/metrics.go is the adapter, and serves GET /metrics).
package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	imetrics "github.com/kloud-dev/kloud/internal/metrics"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// DefaultInterval is how often the poller refreshes the machines' figures and quota use.
const DefaultInterval = 15 * time.Second

// machineInfoTimeout bounds one agent's kite.systemInfo call in a poll; machinePollers is how
// many agents are asked at once.
const (
	machineInfoTimeout = 5 * time.Second
	machinePollers     = 8
)

// Collectors are a server's collectors.
type Collectors struct {
	reg     *prometheus.Registry
	handler http.Handler // reg in Prometheus' format
	kite    *imetrics.Kite

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

// NewCollectors returns the collectors of a server, registered in a registry of their own.
func NewCollectors() *Collectors {
	reg := imetrics.NewRegistry()
	m := &Collectors{
		reg:  reg,
		kite: imetrics.NewKite(reg, "kloud"),
		jobsRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kloud", Name: "jobs_running", Help: "Durable jobs this kloud runs now, by kind.",
		}, []string{"kind"}),
		jobsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kloud", Name: "jobs_finished_total", Help: "Durable jobs ended by this kloud, by kind and state (succeeded, failed, cancelled).",
		}, []string{"kind", "state"}),
		jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kloud", Name: "job_duration_seconds", Help: "How long durable jobs ran in this kloud, by kind and final state.",
			Buckets: imetrics.LongBuckets,
		}, []string{"kind", "state"}),
		plannerWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kloud", Name: "planner_waiting_agents", Help: "Machine agents the planner waits for now (registration, ping, provisioning).",
		}),
		plannerWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kloud", Name: "planner_wait_seconds", Help: "How long the planner waited for a machine's agent, by result (ok, failed).",
			Buckets: imetrics.LongBuckets,
		}, []string{"result"}),
		termBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kloud", Name: "terminal_bytes_total", Help: "Web terminal bytes relayed, by direction (in: browser to machine, out: machine to browser).",
		}, []string{"direction"}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kloud", Name: "store_command_duration_seconds", Help: "Latency of the store's database commands, by operation (find, update, insert, ...).",
			Buckets: imetrics.RPCBuckets,
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
	m.handler = imetrics.Handler(reg)
	reg.MustRegister(m.jobsRunning, m.jobsFinished, m.jobDuration, m.plannerWaiting, m.plannerWait,
		m.termBytes, m.storeDuration, m.storeFailures, m.machineInfoFailures, m.polled)
	return m
}

// Handler serves the registry in Prometheus' text format (no authentication of its own).
func (m *Collectors) Handler() http.Handler { return m.handler }

// Kite is the kite's Observer (kite.Options.Observer): its calls and connections.
func (m *Collectors) Kite() *imetrics.Kite { return m.kite }

// StoreCommand is the store's Options.OnCommand.
func (m *Collectors) StoreCommand(name string, d time.Duration, failed bool) {
	m.storeDuration.WithLabelValues(name).Observe(d.Seconds())
	if failed {
		m.storeFailures.WithLabelValues(name).Inc()
	}
}

// JobStarted and JobEnded move the job metrics; state is the job's final state (succeeded,
// failed, cancelled).
func (m *Collectors) JobStarted(kind string) { m.jobsRunning.WithLabelValues(kind).Inc() }

func (m *Collectors) JobEnded(kind, state string, d time.Duration) {
	m.jobsRunning.WithLabelValues(kind).Dec()
	m.jobsFinished.WithLabelValues(kind, state).Inc()
	m.jobDuration.WithLabelValues(kind, state).Observe(d.Seconds())
}

// PlannerWaiting notes that the planner waits for one more agent; PlannerWaited that a wait of
// d ended (ok: the agent is there).
func (m *Collectors) PlannerWaiting() { m.plannerWaiting.Inc() }

func (m *Collectors) PlannerWaited(ok bool, d time.Duration) {
	m.plannerWaiting.Dec()
	result := "ok"
	if !ok {
		result = "failed"
	}
	m.plannerWait.WithLabelValues(result).Observe(d.Seconds())
}

// TerminalBytes counts the web terminal bytes relayed in direction ("in": browser to machine,
// "out": machine to browser).
func (m *Collectors) TerminalBytes(direction string) prometheus.Counter {
	return m.termBytes.WithLabelValues(direction)
}

// Options configure a Poller. Collectors, Machines, Agents, Quotas, Kites and Sessions are
// required.
type Options struct {
	Collectors *Collectors // where the gauges go
	Machines   Machines    // every machine
	Agents     Agents      // machines' klients
	Quotas     Quotas      // what users and teams hold, and their quotas
	Kite       *kite.Kite  // kloud's kite: its connections (nil: not watched)
	Kites      Kites       // the kites registered with kloud's kontrol
	Sessions   func() int  // web terminals relayed now (kloud/relay's Hub)

	Interval time.Duration // default DefaultInterval
	Logger   *slog.Logger  // nil: discard
}

// Machines lists every machine.
type Machines interface {
	All(ctx context.Context) ([]model.Machine, error)
}

// Agents reaches machines' klients.
type Agents interface {
	// Agent is the connection of the agent registered as kiteID now (nil: none).
	Agent(kiteID string) Agent
}

// Agent calls a machine's klient (a *kite.Conn).
type Agent interface {
	Call(ctx context.Context, method string, params, result any) error
}

// Quotas is kloud's quota accounting.
type Quotas interface {
	// Use is what every subject (user/NAME, team/SLUG) holds given machines ms, and the quota
	// of each subject use names.
	Use(ctx context.Context, ms []model.Machine) (use, limits map[string]api.Quota, err error)
}

// Kites counts the kites registered with kloud's kontrol now.
type Kites interface {
	// Registered counts them by kind: "agent" (a machine's klient), "plugin" (a provider
	// plugin), "other".
	Registered() map[string]int
}

// Poller refreshes the polled gauges and holds the gauges read from the components.
type Poller struct {
	o   Options
	log *slog.Logger
}

// New registers o's components' gauges in o.Collectors and returns the poller of the machines'
// figures and quota use.
func New(o Options) (*Poller, error) {
	if o.Collectors == nil || o.Machines == nil || o.Agents == nil || o.Quotas == nil || o.Kites == nil || o.Sessions == nil {
		return nil, errors.New("metrics: Collectors, Machines, Agents, Quotas, Kites and Sessions are required")
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	p := &Poller{o: o, log: log}
	p.watch()
	return p, nil
}

// watch registers the gauges read from the components at scrape time: kite connections,
// registered kites, web terminal sessions.
func (p *Poller) watch() {
	m := p.o.Collectors
	if p.o.Kite != nil {
		m.kite.Watch(p.o.Kite)
	}
	m.reg.MustRegister(
		&funcCollector{desc: prometheus.NewDesc("kloud_kontrol_registered_kites",
			"Kites registered with kloud's kontrol now, by kind (agent: a machine's klient; plugin: a provider plugin; other).", []string{"kind"}, nil),
			collect: func(emit func(v float64, labels ...string)) {
				n := map[string]int{"agent": 0, "plugin": 0, "other": 0}
				for kind, v := range p.o.Kites.Registered() {
					n[kind] += v
				}
				for kind, v := range n {
					emit(float64(v), kind)
				}
			}},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kloud", Name: "terminal_sessions", Help: "Web terminals relayed by this kloud now."},
			func() float64 { return float64(p.o.Sessions()) }),
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

// snapshot is the polled gauges: each poll replaces them whole, so a machine that went away or
// a subject without stacks disappears from the next scrape.
type snapshot struct {
	mu      sync.Mutex
	metrics []prometheus.Metric
	descs   []*prometheus.Desc
}

// The polled gauges. Machine figures are labelled by machine id and owner (the only per-object
// labels kloud exports); quota gauges by subject (user/NAME, team/SLUG) and resource (machines,
// cores, memory_bytes, disk_bytes, buckets, bucket_bytes).
var (
	descMachineCPUs        = prometheus.NewDesc("kloud_machine_cpus", "Processors a machine's klient reports.", []string{"machine", "owner"}, nil)
	descMachineLoad1       = prometheus.NewDesc("kloud_machine_load1", "A machine's 1-minute load average, as its klient reports it.", []string{"machine", "owner"}, nil)
	descMachineMemUsed     = prometheus.NewDesc("kloud_machine_memory_used_bytes", "Memory in use on a machine (total - free - buffers), as its klient reports it.", []string{"machine", "owner"}, nil)
	descMachineMemTotal    = prometheus.NewDesc("kloud_machine_memory_total_bytes", "A machine's memory, as its klient reports it.", []string{"machine", "owner"}, nil)
	descMachineDiskUsed    = prometheus.NewDesc("kloud_machine_disk_used_bytes", "Disk in use on a machine's root file system, as its klient reports it.", []string{"machine", "owner"}, nil)
	descMachineDiskTotal   = prometheus.NewDesc("kloud_machine_disk_total_bytes", "Size of a machine's root file system, as its klient reports it.", []string{"machine", "owner"}, nil)
	descQuotaUsed          = prometheus.NewDesc("kloud_quota_used", "What a user's or team's stacks hold, by resource (machines, cores, memory_bytes, disk_bytes, buckets, bucket_bytes).", []string{"subject", "resource"}, nil)
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

// Run refreshes the polled gauges at once, then every interval, until ctx ends.
func (p *Poller) Run(ctx context.Context) {
	t := time.NewTicker(p.o.Interval)
	defer t.Stop()
	for {
		p.Poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll refreshes the machines' figures and the quota use once.
func (p *Poller) Poll(ctx context.Context) {
	var out []prometheus.Metric
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...))
	}
	ms, err := p.o.Machines.All(ctx)
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("metrics: list machines", "err", err)
		}
		return // keep the last figures: a store outage shows in the store metrics and /readyz
	}
	p.pollMachines(ctx, ms, gauge)
	if err := p.pollQuotas(ctx, ms, gauge); err != nil {
		if ctx.Err() == nil {
			p.log.Warn("metrics: quota use", "err", err)
		}
		return
	}
	gauge(descMetricsPollSeconds, float64(time.Now().UnixNano())/1e9)
	p.o.Collectors.polled.set(out)
}

// pollMachines asks every connected agent for kite.systemInfo (machinePollers at a time, each
// within machineInfoTimeout).
func (p *Poller) pollMachines(ctx context.Context, ms []model.Machine, gauge func(*prometheus.Desc, float64, ...string)) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, machinePollers)
	for i := range ms {
		m := &ms[i]
		if m.KiteID == "" {
			continue
		}
		c := p.o.Agents.Agent(m.KiteID)
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
				p.o.Collectors.machineInfoFailures.Inc()
				p.log.Debug("metrics: machine info", "machine", m.ID, "err", err)
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

// pollQuotas emits what every user and team holds and their quotas (Quotas.Use).
func (p *Poller) pollQuotas(ctx context.Context, ms []model.Machine, gauge func(*prometheus.Desc, float64, ...string)) error {
	use, limits, err := p.o.Quotas.Use(ctx, ms)
	if err != nil {
		return err
	}
	for sub, u := range use {
		for _, q := range []struct {
			d *prometheus.Desc
			v api.Quota
		}{{descQuotaUsed, u}, {descQuotaLimit, limits[sub]}} {
			gauge(q.d, float64(q.v.Machines), sub, "machines")
			gauge(q.d, q.v.Cores, sub, "cores")
			gauge(q.d, float64(q.v.MemoryMB)*(1<<20), sub, "memory_bytes")
			gauge(q.d, float64(q.v.DiskMB)*(1<<20), sub, "disk_bytes")
			gauge(q.d, float64(q.v.Buckets), sub, "buckets")
			gauge(q.d, float64(q.v.BucketMB)*(1<<20), sub, "bucket_bytes")
		}
	}
	return nil
}
