package kloud

import (
	"context"
	"net/http"
	"sort"
	"time"
)

// Health: GET /healthz says the process serves HTTP; GET /readyz says whether kloud can do its
// work, naming what is not ready; the store monitor logs a store outage once when it starts
// (with the cause) and once when it ends.

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

// Readiness checks the store (a ping), the terraformer (configured, not marked down by its
// supervisor) and each provider (its Available check).
func (s *Server) Readiness(ctx context.Context) Readiness {
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
	err := s.store.Ping(sctx)
	cancel()
	add("store", true, err)
	add("terraformer", true, s.terraformerReady())
	for _, n := range s.providers.Names() {
		p, err := s.providers.Lookup(n)
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
func (s *Server) terraformerReady() error {
	tf, err := s.terraformer()
	if err != nil {
		return err
	}
	if u, ok := tf.(interface{ Unavailable() error }); ok {
		return u.Unavailable()
	}
	return nil
}

// serveReadyz answers GET /readyz: 200 when ready, 503 when not, with the Readiness body.
func (s *Server) serveReadyz(w http.ResponseWriter, r *http.Request) {
	rd := s.Readiness(r.Context())
	code := http.StatusOK
	if !rd.Ready {
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, code, rd)
}

// monitorStore pings the store every storeMonitorInterval until ctx ends and logs each outage
// once: an error line with the cause when the store stops answering, an info line with the
// outage's duration when it answers again. Calls made meanwhile fail with the
// store-unavailable code (errors.go) without logging each.
func (s *Server) monitorStore(ctx context.Context) {
	var downSince time.Time
	t := time.NewTicker(storeMonitorInterval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*readyTimeout)
		err := s.store.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && downSince.IsZero():
			downSince = time.Now()
			s.log.ErrorContext(ctx, "store unavailable: calls fail with storeUnavailable until it answers again", "cause", err)
		case err == nil && !downSince.IsZero():
			s.log.InfoContext(ctx, "store available again", "down", time.Since(downSince).Round(time.Millisecond))
			downSince = time.Time{}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
