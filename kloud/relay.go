package kloud

import (
	"context"
	"net/http"
	"time"

	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/relay"
	"github.com/kloud-dev/kloud/kloud/store"
)

// The relays of terminals, port forwards and web apps are package kloud/relay; kloud builds
// its Hub here (relayDeps: kloud's users, machines, agents, tokens and audit log as the hub's
// small interfaces), mounts its handlers (routes.go) and sends app hosts to it (rootHandler).

// DefaultAppsHost is the default of Options.AppsHost.
const DefaultAppsHost = relay.DefaultAppsHost

func newRelay(s *Server) (*relay.Hub, error) {
	d := relayDeps{s}
	return relay.New(relay.Options{Access: d, Agents: d, Tokens: d, Audit: d,
		PublicURL: s.opts.PublicURL, AppsHost: s.opts.AppsHost, Browser: s.opts.Browser,
		Replica: s.mesh.id, Peer: s.mesh.PeerURL, PeerTLS: s.opts.PeerTLS, // mesh.go
		Activity: s.idle.Touch, // kloud/idle: terminals, tunnels and web apps are activity
		KeepHostKey: func(ctx context.Context, id, key string) error { // relay/ssh.go
			return s.store.Machines().Set(ctx, id, store.MachineSet{SSHHostKey: &key})
		},
		Metrics: relay.Metrics{TerminalBytesIn: s.metrics.TerminalBytes("in"),
			TerminalBytesOut: s.metrics.TerminalBytes("out")},
		Logger: s.log})
}

// relayDeps is kloud as the relay's Access, Agents, Tokens and Auditor.
type relayDeps struct{ s *Server }

func (d relayDeps) Request(r *http.Request, id string) (string, *model.Machine, error) {
	c, err := d.s.httpCaller(r)
	if err != nil {
		return "", nil, wireError(err)
	}
	m, err := d.s.loadMachine(r.Context(), c, id)
	if err != nil {
		return c.Username, nil, wireError(err)
	}
	return c.Username, m, nil
}

func (d relayDeps) Machine(ctx context.Context, user, id string) (*model.Machine, error) {
	c, err := d.s.callerByName(ctx, user, false)
	if err != nil {
		return nil, err
	}
	return d.s.loadMachine(ctx, c, id)
}

func (d relayDeps) Agent(ctx context.Context, m *model.Machine) (relay.Agent, error) {
	c, err := d.s.agentConn(ctx, m)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// KloudURL is the origin a machine's klient reaches kloud at: its provider's (the one klient's
// kontrol URL names), else the public URL.
func (d relayDeps) KloudURL(m *model.Machine) string {
	if p, err := d.s.providers.Lookup(m.Provider); err == nil {
		return d.s.kloudURLFor(p)
	}
	return d.s.opts.PublicURL
}

func (d relayDeps) Sign(user, audience string, ttl time.Duration) (string, error) {
	return d.s.Signer().Token(user, audience, ttl)
}

func (d relayDeps) Verify(ctx context.Context, raw, audience string) (string, error) {
	c, err := d.s.Kontrol.Verifier().Token(ctx, raw, audience)
	if err != nil {
		return "", err
	}
	return c.Subject, nil
}

func (d relayDeps) Attempt(r *http.Request, action, user, target string, status int) {
	d.s.audits.addHTTP(r, action, user, target, status)
}

func (d relayDeps) Closed(r *http.Request, action, user, target string, dur time.Duration, bytes int64) {
	d.s.audits.add(r.Context(), store.AuditEntry{Action: action, User: user, Remote: clientIP(r), Target: target,
		Result: store.AuditOK, Duration: dur.Milliseconds(), Bytes: bytes}, nil)
}

// rootHandler sends app hosts to the relay's web apps and everything else to kloud's routes.
func (s *Server) rootHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Each request's log lines carry its id (also sent as X-Request-Id) and method.
		r = s.opts.Browser.Forwarded(r) // a trusted proxy's client address and host (kloud serve --trusted-proxy)
		id := kite.NewRequestID()
		w.Header().Set("X-Request-Id", id)
		r = r.WithContext(kite.WithRequestInfo(r.Context(), kite.RequestInfo{ID: id, Method: r.Method + " " + r.URL.Path}))
		if r.TLS != nil {
			w.Header().Set("Strict-Transport-Security", tlsconf.HSTS)
		}
		if s.relay.ServeApp(w, r) {
			return
		}
		s.mux.ServeHTTP(w, r)
	})
}
