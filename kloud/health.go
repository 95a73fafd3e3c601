package kloud

import (
	"context"
	"log/slog"
	"net/http"
	"sort"
	"time"

	"github.com/kloud-dev/kloud/kloud/gc"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Health: GET /healthz says the process serves HTTP; GET /readyz says whether kloud can do its
// work, naming what is not ready; the store monitor logs a store outage once when it starts
// (with the cause) and once when it ends.

// opsAPI serves what operators use: GET /readyz and the store monitor (this file),
// kloud.version and kloud.doctor (doctor.go), gc.run and the periodic gc sweep (gc.go) and
// GET /metrics (metrics.go).
type opsAPI struct {
	store       *store.Store
	providers   *provider.Registry
	terraformer func() (Terraformer, error) // Server.terraformer: set later by SetTerraformer
	gc          *gc.Collector
	checks      []DoctorCheck // Options.Doctor
	dataDir     string
	httpCaller  func(r *http.Request) (*Caller, error) // GET /metrics (httpauth.go)
	writeErr    func(w http.ResponseWriter, err error)
	metrics     http.Handler // the collectors' (kloud/metrics)
	log         *slog.Logger
}

// newOpsAPI wires the opsAPI of s (New).
func newOpsAPI(s *Server) *opsAPI {
	return &opsAPI{store: s.store, providers: s.providers, terraformer: s.terraformer, gc: newGC(s),
		checks: s.opts.Doctor, dataDir: s.opts.DataDir, httpCaller: s.httpCaller, writeErr: s.writeErr,
		metrics: s.metrics.Handler(), log: s.log}
}

// readyTimeout bounds each readiness check, so /readyz answers within it whatever hangs.
const readyTimeout = time.Second

// storeMonitorInterval is how often the store monitor pings the store.
const storeMonitorInterval = time.Second

// ReadyCheck is one component of /readyz's answer.
type ReadyCheck struct {
	Ready bool   `json:"ready"`
	Error string `json:"error,omitempty"`
	// Required: kloud is not ready while this check fails. Providers are not required (one
	// provider missing on this host, e.g. no Docker, leaves the others usable); they are listed
	// so an operator sees them.
	Required bool `json:"required"`
}

// Readiness is /readyz's JSON body.
type Readiness struct {
	Ready bool `json:"ready"`
	// NotReady names the failing required checks ("store", "terraformer"), sorted.
	NotReady []string `json:"notReady"`
	// Checks by name: "store", "terraformer", "provider.NAME".
	Checks map[string]ReadyCheck `json:"checks"`
}

// readiness checks the store (a ping), the terraformer (configured, not marked down by its
// supervisor) and each provider (its Available check).
func (o *opsAPI) readiness(ctx context.Context) Readiness {
	r := Readiness{Checks: map[string]ReadyCheck{}, NotReady: []string{}}
	add := func(name string, required bool, err error) {
		c := ReadyCheck{Ready: err == nil, Required: required}
		if err != nil {
			c.Error = err.Error()
			if required {
				r.NotReady = append(r.NotReady, name)
			}
		}
		r.Checks[name] = c
	}
	sctx, cancel := context.WithTimeout(ctx, readyTimeout)
	err := o.store.Ping(sctx)
	cancel()
	add("store", true, err)
	add("terraformer", true, o.terraformerReady())
	for _, n := range o.providers.Names() {
		p, err := o.providers.Lookup(n)
		if err == nil && p.Available != nil {
			err = p.Available()
		}
		add("provider."+n, false, err)
	}
	sort.Strings(r.NotReady)
	r.Ready = len(r.NotReady) == 0
	return r
}

// terraformerReady is nil when kloud has a terraformer that is not known to be down.
func (o *opsAPI) terraformerReady() error {
	tf, err := o.terraformer()
	if err != nil {
		return err
	}
	if u, ok := tf.(interface{ Unavailable() error }); ok {
		return u.Unavailable()
	}
	return nil
}

// serveReadyz answers GET /readyz: 200 when ready, 503 when not, with the Readiness body.
func (o *opsAPI) serveReadyz(w http.ResponseWriter, r *http.Request) {
	rd := o.readiness(r.Context())
	code := http.StatusOK
	if !rd.Ready {
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, code, rd)
}

// monitor pings the store every storeMonitorInterval until ctx ends and logs each outage
// once: an error line with the cause when the store stops answering, an info line with the
// outage's duration when it answers again. Calls made meanwhile fail with the
// store-unavailable code (errors.go) without logging each.
func (o *opsAPI) monitor(ctx context.Context) {
	var downSince time.Time
	t := time.NewTicker(storeMonitorInterval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*readyTimeout)
		err := o.store.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && downSince.IsZero():
			downSince = time.Now()
			o.log.ErrorContext(ctx, "store unavailable: calls fail with storeUnavailable until it answers again", "cause", err)
		case err == nil && !downSince.IsZero():
			o.log.InfoContext(ctx, "store available again", "down", time.Since(downSince).Round(time.Millisecond))
			downSince = time.Time{}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
