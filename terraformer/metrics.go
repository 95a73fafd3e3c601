package terraformer

import (
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kloud-dev/kloud/internal/metrics"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// Metrics: GET /metrics in Prometheus' text format, from a registry of this terraformer's own.
// On the main address it needs "Authorization: Bearer <kite key or token>" of one of the kloud
// users or of kloud's administrator ("admin"); with Config.MetricsAddr (terraformer
// --metrics-addr) it is also served without authentication there. Besides the kite's metrics
// (terraformer_rpc_calls_total, ...; internal/metrics):
//
//	terraformer_operation_duration_seconds{op,status}  histogram: terraform runs by op (plan, apply, destroy) and final status
//	terraformer_operation_failures_total{op,kind}      counter: runs that did not succeed, by the error's kind (terraform, cancelled, hung, ...)
//	terraformer_operations_running                     gauge: runs going on now

// Metrics are a terraformer's collectors. NewMetrics makes them; OnFinish is the engine's
// Options.OnFinish, Kite the kite's Options.Observer, Watch adds what is read from the engine
// and the kite once they exist.
type Metrics struct {
	Reg      *prometheus.Registry
	Kite     *metrics.Kite
	duration *prometheus.HistogramVec
	failures *prometheus.CounterVec
}

// NewMetrics registers terraformer's metrics on a new registry.
func NewMetrics() *Metrics {
	reg := metrics.NewRegistry()
	m := &Metrics{
		Reg:  reg,
		Kite: metrics.NewKite(reg, "terraformer"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "terraformer", Name: "operation_duration_seconds",
			Help:    "How long terraform runs took, by operation (plan, apply, destroy) and final status (succeeded, failed, cancelled, hung).",
			Buckets: metrics.LongBuckets,
		}, []string{"op", "status"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "terraformer", Name: "operation_failures_total",
			Help: "Terraform runs that did not succeed, by operation and the error's kind (terraform, cancelled, hung, closing, lease, internal).",
		}, []string{"op", "kind"}),
	}
	reg.MustRegister(m.duration, m.failures)
	return m
}

// OnFinish records a final job (tfrun.Options.OnFinish).
func (m *Metrics) OnFinish(j *tfrun.Job) {
	if !j.StartedAt.IsZero() && !j.FinishedAt.IsZero() {
		m.duration.WithLabelValues(string(j.Op), string(j.Status)).Observe(j.FinishedAt.Sub(j.StartedAt).Seconds())
	}
	if j.Status != tfrun.StatusSucceeded {
		kind := tfrun.KindInternal
		if j.Error != nil && j.Error.Kind != "" {
			kind = j.Error.Kind
		}
		m.failures.WithLabelValues(string(j.Op), kind).Inc()
	}
}

// Watch registers the gauges read from k and engine at scrape time.
func (m *Metrics) Watch(k *kite.Kite, engine *tfrun.Engine) {
	m.Kite.Watch(k)
	m.Reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "terraformer", Name: "operations_running", Help: "Terraform runs going on now.",
	}, func() float64 { return float64(engine.Running()) }))
}

// Handler serves the metrics without authentication (the --metrics-addr listener).
func (m *Metrics) Handler() http.Handler { return metrics.Handler(m.Reg) }

// AuthHandler serves the metrics to callers whose bearer kite key or token (for kite k)
// authenticates with auth and names one of users or "admin"; others get 401 or 403.
func (m *Metrics) AuthHandler(k *kite.Kite, auth kite.Authenticator, users []string) http.Handler {
	h := m.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || raw == "" {
			http.Error(w, "send Authorization: Bearer <kite key> of kloud or its admin (or use terraformer --metrics-addr)", http.StatusUnauthorized)
			return
		}
		var p *kite.Principal
		var err error
		for _, typ := range []string{kite.AuthKiteKey, kite.AuthToken} {
			if p, err = auth.Authenticate(r.Context(), k.Identity(), kite.Auth{Type: typ, Key: raw}); err == nil {
				break
			}
		}
		if err != nil {
			http.Error(w, "credential not accepted: "+err.Error(), http.StatusUnauthorized)
			return
		}
		if p.Username != "admin" && !slices.Contains(users, p.Username) {
			http.Error(w, "/metrics is for kloud and its administrator", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
