package docker

import (
	"bytes"
	"context"
	"maps"
	"net/http"
	"strings"
)

// serveNetworked forwards an authorized proxy call (path without the version prefix) and keeps
// the machines' network in step with it: a container create (and the provider's look at the
// network before it) holds Docker.netLife for reading and makes the network if a removal took
// it; a successful container delete removes the network when it was the last container on it;
// a successful start or restart rebuilds the machines' firewall (firewall.go) and shows the
// machine its limits (limits.go), as an update of its limits does.
func (d *Docker) serveNetworked(w http.ResponseWriter, r *http.Request, path string, next http.Handler) {
	var id, op string // a container call's container and operation (service.go's containerRE)
	if m := containerRE.FindStringSubmatch(path); m != nil {
		id, op = m[1], m[2]
	}
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
	case r.Method == http.MethodDelete && id != "" && op == "":
		// The answer (a status and at most a short error) is held until the network is dealt
		// with, so whoever deleted the last container sees the network gone when it is told.
		hold(w, r, next, func() error {
			if _, err := d.removeNetworkIfUnused(context.WithoutCancel(r.Context())); err != nil {
				d.log.Warn("docker provider: remove the machines' network after the last container", "err", err)
			}
			return nil
		})
	case r.Method == http.MethodPost && id != "" && (op == "/start" || op == "/restart"):
		// A started container gets its place in the firewall before the caller is told
		// (firewall.go); if it cannot, it is stopped again and the caller gets the error.
		hold(w, r, next, func() error {
			err := d.firewallAfterStart(context.WithoutCancel(r.Context()), id)
			if err != nil {
				d.log.Warn("docker provider: firewall after a container start", "container", id, "err", err)
				return err
			}
			d.limitsAfterStart(context.WithoutCancel(r.Context()), id) // limits.go
			return nil
		})
	case r.Method == http.MethodPost && id != "" && op == "/update":
		// New limits (proxyupdate.go): the machine's view of them follows (limits.go).
		hold(w, r, next, func() error {
			d.limitsAfterStart(context.WithoutCancel(r.Context()), id)
			return nil
		})
	default:
		next.ServeHTTP(w, r)
	}
}

// hold serves r into a recorder (the answers it is used for are a status and at most a short
// error) and, if the daemon said yes, runs after before answering: with the daemon's answer, or
// after's error.
func hold(w http.ResponseWriter, r *http.Request, next http.Handler, after func() error) {
	rec := &recorder{code: http.StatusOK, header: http.Header{}}
	next.ServeHTTP(rec, r)
	if rec.code/100 == 2 {
		if err := after(); err != nil {
			writeAPIError(w, http.StatusInternalServerError, "kloud: "+err.Error())
			return
		}
	}
	maps.Copy(w.Header(), rec.header)
	w.WriteHeader(rec.code)
	w.Write(rec.body.Bytes())
}

// recorder is the http.ResponseWriter hold serves into: the status, the header and the body, kept
// for hold to pass on (net/http/httptest's recorder would link a test package into kloud).
type recorder struct {
	code        int
	header      http.Header
	body        bytes.Buffer
	wroteHeader bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if !r.wroteHeader {
		r.code, r.wroteHeader = code, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.body.Write(b)
}

// Flush does nothing: hold answers once next is done.
func (r *recorder) Flush() {}
