package docker

import (
	"context"
	"net/http"
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
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.status/100 == 2 {
			if _, err := d.removeNetworkIfUnused(context.WithoutCancel(r.Context())); err != nil {
				d.log.Warn("docker provider: remove the machines' network after the last container", "err", err)
			}
		}
	default:
		next.ServeHTTP(w, r)
	}
}

// statusWriter records the status code written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
