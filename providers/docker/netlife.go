package docker

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
)

// serveNetworked forwards an authorized proxy call (path without the version prefix) and keeps
// the machines' network in step with it: a container create (and the provider's look at the
// network before it) holds Docker.netLife for reading and makes the network if a removal took
// it; a successful container delete removes the network when it was the last container on it.
func (d *Docker) serveNetworked(w http.ResponseWriter, r *http.Request, path string, next http.Handler) {
	switch {
	case r.Method == http.MethodPost && path == "/containers/create",
		r.Method == http.MethodGet && strings.HasPrefix(path, "/networks/"):
		d.netLife.RLock()
		defer d.netLife.RUnlock()
		if err := d.EnsureNetwork(r.Context()); err != nil {
			writeAPIError(w, http.StatusServiceUnavailable, "kloud: "+err.Error())
			return
		}
		next.ServeHTTP(w, r)
	case r.Method == http.MethodDelete && strings.HasPrefix(path, "/containers/"):
		// The answer (a status and at most a short error) is held until the network is dealt
		// with, so whoever deleted the last container sees the network gone when it is told.
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		if rec.Code/100 == 2 {
			if _, err := d.removeNetworkIfUnused(context.WithoutCancel(r.Context())); err != nil {
				d.log.Warn("docker provider: remove the machines' network after the last container", "err", err)
			}
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	default:
		next.ServeHTTP(w, r)
	}
}
