// Package metrics holds what kloud and terraformer share to serve GET /metrics in Prometheus'
// text format: a registry per server (NewRegistry, never the global one), the kite's metrics
// (Kite: an kite.Observer plus a connections gauge, so package kite imports no metrics library),
// the handler, and the separate unauthenticated listener of --metrics-addr (Serve).
//
// Start with NewKite; the components' own metrics (jobs, terminals, store, terraform runs) are
// defined by the packages that own them (kloud/metrics, terraformer/metrics.go).
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kloud-dev/kloud/kite"
)

// RPCBuckets are the buckets of call latencies (seconds): milliseconds for most calls, minutes
// for plans and long waits.
var RPCBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// LongBuckets are the buckets of long operations (jobs, terraform runs, agent waits), seconds.
var LongBuckets = []float64{.1, .5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600}

// NewRegistry returns a registry with the Go runtime's and the process's collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves reg in Prometheus' text (or protobuf) format.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// Kite is a kite's metrics, prefixed with the server's namespace (kloud_, terraformer_):
//
//	<ns>_rpc_calls_total{method,code}             counter: served calls by method and JSON-RPC code (0: a result; "other": a code not in the protocol)
//	<ns>_rpc_duration_seconds{method}             histogram: how long handlers ran
//	<ns>_kite_handshake_rejections_total{reason}  counter: refused handshakes (kite.Reject*)
//	<ns>_kite_connections{auth}                   gauge: open connections by how the peer authenticated
//
// It is the kite's Options.Observer; Watch adds the connections gauge once the kite exists.
type Kite struct {
	ns       string
	reg      prometheus.Registerer
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	rejects  *prometheus.CounterVec
}

// NewKite registers the kite metrics of namespace ns on reg.
func NewKite(reg prometheus.Registerer, ns string) *Kite {
	m := &Kite{
		ns:  ns,
		reg: reg,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "rpc_calls_total",
			Help: "Kite RPC calls served, by method and JSON-RPC code (0: success).",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "rpc_duration_seconds",
			Help: "How long kite RPC handlers ran, by method.", Buckets: RPCBuckets,
		}, []string{"method"}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "kite_handshake_rejections_total",
			Help: "Kite handshakes refused, by reason (invalid, credential, refused, repeated, timeout).",
		}, []string{"reason"}),
	}
	for _, r := range []string{kite.RejectInvalid, kite.RejectCredential, kite.RejectRefused, kite.RejectRepeated, kite.RejectTimeout} {
		m.rejects.WithLabelValues(r) // every reason is exported from the start, at 0
	}
	reg.MustRegister(m.calls, m.duration, m.rejects)
	return m
}

// knownCodes are the JSON-RPC codes of protocol v1 (kite/errors.go). A handler may pass on an
// error a peer sent (a machine's agent is in its owner's hands): any other code is counted as
// "other", so no peer can add label values.
var knownCodes = map[int64]bool{0: true, kite.CodeParse: true, kite.CodeInvalidRequest: true, kite.CodeMethodNotFound: true,
	kite.CodeInvalidParams: true, kite.CodeInternal: true, kite.CodeAuth: true, kite.CodePermission: true, kite.CodeNotFound: true,
	kite.CodeConflict: true, kite.CodeState: true, kite.CodeTimeout: true, kite.CodeRateLimited: true, kite.CodeTooLarge: true,
	kite.CodeUnavailable: true, kite.CodeStoreUnavailable: true}

// Served implements kite.Observer.
func (m *Kite) Served(method string, code int64, d time.Duration) {
	c := "other"
	if knownCodes[code] {
		c = strconv.FormatInt(code, 10)
	}
	m.calls.WithLabelValues(method, c).Inc()
	m.duration.WithLabelValues(method).Observe(d.Seconds())
}

// HandshakeRejected implements kite.Observer.
func (m *Kite) HandshakeRejected(reason string) { m.rejects.WithLabelValues(reason).Inc() }

// Watch registers the gauge of k's open connections, by the peer's auth type (kiteKey, token,
// session, agentKey, pluginKey; "none" before the handshake, "dialed" for connections k
// dialed).
func (m *Kite) Watch(k *kite.Kite) {
	m.reg.MustRegister(&connCollector{k: k, desc: prometheus.NewDesc(prometheus.BuildFQName(m.ns, "kite", "connections"),
		"Open kite connections, by how the peer authenticated.", []string{"auth"}, nil)})
}

type connCollector struct {
	k    *kite.Kite
	desc *prometheus.Desc
}

func (c *connCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *connCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	for _, conn := range c.k.Conns() {
		auth := "none"
		switch p := conn.Principal(); {
		case conn.Dialed():
			auth = "dialed"
		case p != nil:
			auth = p.Type
		}
		n[auth]++
	}
	for auth, v := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), auth)
	}
}

// Serve serves h on addr (--metrics-addr: unauthenticated, for a Prometheus on a private
// network) until ctx ends. It returns once it listens, or the listen error; listening, if set,
// gets the bound address.
func Serve(ctx context.Context, addr string, h http.Handler, log *slog.Logger, listening func(net.Addr)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if listening != nil {
		listening(ln.Addr())
	}
	log.Info("metrics listening", "addr", ln.Addr().String())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("metrics listener", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx) //nolint:errcheck // shutting down
	}()
	return nil
}
