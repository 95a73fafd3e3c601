package kloud

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Port forwarding through kloud (docs/protocol.md "Port forwarding"). A TCP port of a machine
// is reached over the machine's agent connection, never by a route from the user to the
// machine: kloud calls port.connect on the machine's klient with a one-time ticket, klient
// dials the port on the machine's loopback and kloud's attach endpoint (the terminal's), and
// kloud has a tunnel (package internal/tunnel) to that port. Two users of it:
//
//	GET /api/machines/{id}/ports/{port}/tcp     WebSocket: a tunnel for `kloud port-forward`
//	GET /api/machines/{id}/ports/{port}/open    the browser: a machine's web app (below)
//
// Web apps get their own origin, never kloud UI's: what a machine serves is the machine
// user's code, and on the UI's origin it would run with the user's kloud session. Each port of
// each machine is the host p<port>--m<machine id>.<apps host> (Options.AppsHost, `kloud serve
// --apps-host`, default "localhost": browsers resolve *.localhost to loopback; in production a
// wildcard DNS name of a domain that is not the UI's), on kloud's own listener and port. The UI's
// /open (session cookie) mints a one-time ticket and redirects to /__kloud/auth?ticket= on the
// app's host, which sets a host-only cookie (kloud_app: a token for that user and that host
// only, 1 h) and redirects to the path asked for. Every app request is authorised again (the
// owner, or a terminal or full share of the machine now), the kloud_app cookie is stripped, and
// the request (WebSocket upgrades included) is proxied through a tunnel of that user. kloud's
// own session cookie is host-only on the UI's host, so an app never sees it.
//
// Who may forward: the machine's owner and users it is shared with with a terminal or full
// grant (klient checks the user's token against its own access list too); a read-only share
// may not. Admins get nothing by being admins.

const (
	appCookie     = "kloud_app"
	appAuthPath   = "/__kloud/auth"
	appCookieTTL  = time.Hour
	appTicketTTL  = 30 * time.Second
	appTunnelHost = ".tunnel.kloud" // the dial address of a pooled app connection: u<user>.m<id>.p<port>.tunnel.kloud
)

// DefaultAppsHost is the default of Options.AppsHost.
const DefaultAppsHost = "localhost"

var appLabel = regexp.MustCompile(`^p([0-9]{1,5})--m([0-9a-z]{1,40})$`)

// appsHub serves machines' web apps on their own hosts.
type appsHub struct {
	s        *Server
	host     string // the apps host name (lower case, no port), "" when off
	port     string // the port app URLs name ("" for the scheme's default)
	scheme   string // http or https, as the public URL's
	proxy    *httputil.ReverseProxy
	tr       *http.Transport
	mu       sync.Mutex
	tickets  map[string]appTicket
	disabled bool
}

type appTicket struct {
	user, machine, path string
	port                int
	exp                 time.Time
}

func newAppsHub(s *Server) (*appsHub, error) {
	h := &appsHub{s: s, tickets: map[string]appTicket{}}
	pu, err := url.Parse(s.opts.PublicURL)
	if err != nil {
		return nil, fmt.Errorf("kloud: public url: %w", err)
	}
	h.scheme = pu.Scheme
	switch s.opts.AppsHost {
	case "off", "-":
		h.disabled = true
	default:
		host := s.opts.AppsHost
		if host == "" {
			host = DefaultAppsHost
		}
		if name, port, err := net.SplitHostPort(host); err == nil {
			h.host, h.port = name, port
		} else {
			h.host, h.port = host, pu.Port()
		}
		h.host = strings.ToLower(strings.Trim(h.host, "."))
		if h.host == "" || strings.ContainsAny(h.host, "/:@ ") {
			return nil, fmt.Errorf("kloud: apps host %q: want a host name (e.g. apps.example.com with a wildcard DNS record, or localhost)", s.opts.AppsHost)
		}
		if strings.EqualFold(h.host, pu.Hostname()) {
			// Host-only cookies keep kloud's session from the apps, but an app could set cookies
			// for the UI's domain: better another domain.
			s.log.Warn("web apps are subdomains of kloud UI's host: pass --apps-host with a domain other than the UI's", "apps_host", h.host, "public_url", s.opts.PublicURL)
		}
	}
	h.tr = &http.Transport{
		DialContext:         h.dial,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	h.proxy = &httputil.ReverseProxy{
		Transport: h.tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(appTargetKey{}).(appTarget)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.dialHost()
			pr.Out.Host = pr.In.Host
			stripCookie(pr.Out.Header, appCookie)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(appTargetKey{}).(appTarget)
			s.log.Info("app proxy", "machine", t.machine, "port", t.port, "user", t.user, "err", err)
			appPage(w, http.StatusBadGateway, "Port "+strconv.Itoa(t.port)+" is not reachable", err)
		},
	}
	return h, nil
}

// appTarget is whose tunnel an app request goes through.
type appTarget struct {
	user, machine string
	port          int
}

type appTargetKey struct{}

func (t appTarget) dialHost() string {
	return "u" + hex.EncodeToString([]byte(t.user)) + ".m" + t.machine + ".p" + strconv.Itoa(t.port) + appTunnelHost
}

// AppURL is the URL of port on machine id's app host ("" when apps are off).
func (s *Server) AppURL(machineID string, port int) string {
	h := s.apps
	if h.disabled {
		return ""
	}
	host := "p" + strconv.Itoa(port) + "--m" + machineID + "." + h.host
	if h.port != "" {
		host = net.JoinHostPort(host, h.port)
	}
	return h.scheme + "://" + host + "/"
}

// match returns the machine id and port of an app host, or ok=false.
func (h *appsHub) match(hostport string) (id string, port int, ok bool) {
	if h.disabled {
		return "", 0, false
	}
	host := hostport
	if name, _, err := net.SplitHostPort(hostport); err == nil {
		host = name
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(host, "."+h.host)
	if !ok {
		return "", 0, false
	}
	m := appLabel.FindStringSubmatch(label)
	if m == nil {
		return "", 0, false
	}
	port, err := strconv.Atoi(m[1])
	if err != nil || klientapi.CheckPort(port) != nil {
		return "", 0, false
	}
	return m[2], port, true
}

// rootHandler sends app hosts to the apps hub and everything else to kloud's routes.
func (s *Server) rootHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Each request's log lines carry its id (also sent as X-Request-Id) and method.
		id := kite.NewRequestID()
		w.Header().Set("X-Request-Id", id)
		r = r.WithContext(kite.WithRequestInfo(r.Context(), kite.RequestInfo{ID: id, Method: r.Method + " " + r.URL.Path}))
		if r.TLS != nil {
			w.Header().Set("Strict-Transport-Security", tlsconf.HSTS)
		}
		if id, port, ok := s.apps.match(r.Host); ok {
			s.apps.serve(w, r, id, port)
			return
		}
		s.mux.ServeHTTP(w, r)
	})
}

// appAudience is the audience of an app cookie's token: that host only.
func appAudience(id string, port int) string { return "app:p" + strconv.Itoa(port) + "--m" + id }

func (h *appsHub) serve(w http.ResponseWriter, r *http.Request, id string, port int) {
	s := h.s
	if r.URL.Path == appAuthPath {
		h.serveAuth(w, r, id, port)
		return
	}
	var user string
	if c, err := r.Cookie(appCookie); err == nil {
		if claims, err := s.Kontrol.Verifier().Token(r.Context(), c.Value, appAudience(id, port)); err == nil {
			user = claims.Subject
		}
	}
	if user == "" {
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Upgrade") == "" {
			http.Redirect(w, r, h.openURL(id, port, r.URL.RequestURI()), http.StatusTemporaryRedirect)
			return
		}
		appPage(w, http.StatusUnauthorized, "Not logged in to this app", fmt.Errorf("open it from kloud first: %s", h.openURL(id, port, "/")))
		return
	}
	c, err := s.callerByName(r.Context(), user, false)
	if err != nil {
		appPage(w, http.StatusForbidden, "Access refused", err)
		return
	}
	m, err := s.loadMachine(r.Context(), c, id)
	if err == nil {
		err = mayForward(c, m)
	}
	if err != nil {
		appPage(w, http.StatusForbidden, "Access refused", err)
		return
	}
	s.touch(id) // idle.go: a web app's request is activity
	ctx := context.WithValue(r.Context(), appTargetKey{}, appTarget{user: user, machine: id, port: port})
	h.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// openURL is the UI's entry to an app (it authenticates the browser on kloud's origin).
func (h *appsHub) openURL(id string, port int, path string) string {
	return strings.TrimRight(h.s.opts.PublicURL, "/") + "/api/machines/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port) + "/open?path=" + url.QueryEscape(path)
}

// serveAuth exchanges a one-time ticket for the app's cookie.
func (h *appsHub) serveAuth(w http.ResponseWriter, r *http.Request, id string, port int) {
	t := r.URL.Query().Get("ticket")
	h.mu.Lock()
	tk, ok := h.tickets[t]
	delete(h.tickets, t)
	h.mu.Unlock()
	if !ok || t == "" || time.Now().After(tk.exp) || tk.machine != id || tk.port != port {
		appPage(w, http.StatusForbidden, "Unknown, used or expired ticket", fmt.Errorf("open the app again from kloud: %s", h.openURL(id, port, "/")))
		return
	}
	tok, err := h.s.Signer().Token(tk.user, appAudience(id, port), appCookieTTL)
	if err != nil {
		appPage(w, http.StatusInternalServerError, "Could not sign the app cookie", err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: appCookie, Value: tok, Path: "/", MaxAge: int(appCookieTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: h.scheme == "https"})
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, tk.path, http.StatusSeeOther)
}

// serveOpen (on kloud's origin, with the user's session) sends the browser to the app's host
// with a one-time ticket.
func (h *appsHub) serveOpen(w http.ResponseWriter, r *http.Request) {
	s := h.s
	if h.disabled {
		writeError(w, http.StatusNotFound, "web apps are off on this kloud (kloud serve --apps-host): use kloud port-forward")
		return
	}
	port, err := pathPort(r)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	path := r.URL.Query().Get("path")
	if path == "" || path[0] != '/' || strings.HasPrefix(path, "//") || strings.HasPrefix(path, `/\`) {
		path = "/"
	}
	c, m, err := s.portTarget(r)
	if c != nil {
		s.auditHTTP(r, auditAppOpen, c.Username, auditPortTarget(r, port), auditStatusOf(err))
	}
	if err != nil {
		var he *httpError
		if errors.As(err, &he) && he.code == http.StatusUnauthorized {
			// A navigation from another site carries no (SameSite=Strict) session cookie: one
			// click on kloud's own page does.
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `<!doctype html><title>Open port %d</title><p>Log in to <a href="/">kloud</a>, then <a href="%s">open port %d of machine %s</a>.</p>`,
				port, html.EscapeString(r.URL.RequestURI()), port, html.EscapeString(r.PathValue("id")))
			return
		}
		s.writeErr(w, err)
		return
	}
	t := rand.Text()
	h.mu.Lock()
	now := time.Now()
	for k, v := range h.tickets {
		if now.After(v.exp) {
			delete(h.tickets, k)
		}
	}
	h.tickets[t] = appTicket{user: c.Username, machine: m.ID, port: port, path: path, exp: now.Add(appTicketTTL)}
	h.mu.Unlock()
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, strings.TrimRight(s.AppURL(m.ID, port), "/")+appAuthPath+"?ticket="+url.QueryEscape(t), http.StatusSeeOther)
}

// dial opens a tunnel for a pooled app connection; addr names user, machine and port
// (appTarget.dialHost).
func (h *appsHub) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	parts := strings.Split(strings.TrimSuffix(host, appTunnelHost), ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return nil, fmt.Errorf("app tunnel address %q", addr)
	}
	user, err := hex.DecodeString(parts[0][1:])
	if err != nil {
		return nil, fmt.Errorf("app tunnel address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(parts[2][1:])
	if err != nil {
		return nil, fmt.Errorf("app tunnel address %q: %w", addr, err)
	}
	c, err := h.s.callerByName(ctx, string(user), false)
	if err != nil {
		return nil, err
	}
	m, err := h.s.loadMachine(ctx, c, parts[1][1:])
	if err != nil {
		return nil, err
	}
	return h.s.openPort(ctx, c, m, port)
}

// closeIdle drops the idle app connections when ctx ends (shutdown).
func (h *appsHub) closeIdle(ctx context.Context) {
	<-ctx.Done()
	h.tr.CloseIdleConnections()
}

// mayForward says whether c may forward ports of m: its owner, a terminal or a full share.
func mayForward(c *Caller, m *Machine) error {
	switch machineRole(c, m) {
	case "owner", GrantTerminal, GrantFull:
		return nil
	case GrantReadonly:
		return fmt.Errorf("machine %s is shared with %s read-only: forwarding its ports needs a terminal or full share: %w", m.Label, c.Username, kite.ErrPermission)
	}
	return fmt.Errorf("machine %s is not shared with %s: only its owner and users it is shared with (terminal or full) reach its ports: %w", m.Label, c.Username, kite.ErrPermission)
}

// portTarget authenticates an HTTP request for a port of the machine it names. On an error
// after the caller is known, it returns the caller too (for the audit log).
func (s *Server) portTarget(r *http.Request) (*Caller, *Machine, error) {
	c, err := s.httpCaller(r)
	if err != nil {
		return nil, nil, err
	}
	m, err := s.loadMachine(r.Context(), c, r.PathValue("id"))
	if err != nil {
		if errors.Is(err, kite.ErrNotFound) {
			return c, nil, &httpError{http.StatusNotFound, err.Error()}
		}
		return c, nil, err
	}
	if err := mayForward(c, m); err != nil {
		return c, nil, &httpError{http.StatusForbidden, err.Error()}
	}
	return c, m, nil
}

func pathPort(r *http.Request) (int, error) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err == nil {
		err = klientapi.CheckPort(port)
	}
	if err != nil {
		return 0, &httpError{http.StatusBadRequest, fmt.Sprintf("port %q: want 1-65535", r.PathValue("port"))}
	}
	return port, nil
}

// openPort connects a tunnel to port of m for c, through m's agent.
func (s *Server) openPort(ctx context.Context, c *Caller, m *Machine, port int) (*tunnel.Conn, error) {
	if err := mayForward(c, m); err != nil {
		return nil, err
	}
	agent, err := s.agentConn(m)
	if err != nil {
		return nil, err
	}
	tok, err := s.userToken(c, m)
	if err != nil {
		return nil, err
	}
	h := s.term
	ticket, ch := h.newTicket()
	defer h.dropTicket(ticket)
	p := klientapi.PortConnectParams{Port: port, Token: tok, Attach: klientapi.Attach{URL: s.attachURL(m), Ticket: ticket}}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := agent.Call(cctx, klientapi.MethodPortConnect, p, nil); err != nil {
		select {
		case ws := <-ch:
			ws.CloseNow()
		default:
		}
		if errors.Is(err, kite.ErrMethodNotFound) {
			return nil, fmt.Errorf("the agent of machine %s predates port forwarding: restart the machine to update it: %w", m.Label, kite.ErrState)
		}
		return nil, fmt.Errorf("port %d of machine %s: %w", port, m.Label, err)
	}
	select {
	case ws := <-ch:
		return tunnel.New(ws, m.Label+":"+strconv.Itoa(port)), nil
	case <-cctx.Done():
		return nil, fmt.Errorf("klient connected port %d but its tunnel never arrived: %w", port, kite.ErrTimeout)
	}
}

// serveTCP relays a `kloud port-forward` connection: a WebSocket tunnel to the port.
func (s *Server) serveTCP(w http.ResponseWriter, r *http.Request) {
	port, err := pathPort(r)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	c, m, err := s.portTarget(r)
	target := auditPortTarget(r, port)
	// The audit log records every attempt of a known user (audit.go), and each tunnel's end.
	refused := func(err error) {
		if c != nil {
			s.auditHTTP(r, auditForwardOpen, c.Username, target, auditStatus(err))
		}
	}
	if err != nil {
		refused(err)
		s.writeErr(w, err)
		return
	}
	if !sameOrigin(r) {
		refused(&httpError{http.StatusForbidden, "cross-origin"})
		writeError(w, http.StatusForbidden, "cross-origin port-forward requests are refused")
		return
	}
	far, err := s.openPort(r.Context(), c, m, port)
	if err != nil {
		refused(err)
		s.writeErr(w, err)
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		far.CloseWith(tunnel.CloseNormal, "the client went away")
		return
	}
	near := &countingConn{Conn: tunnel.New(ws, "client"), touch: func() { s.touch(m.ID) }}
	log := s.log.With("machine", m.ID, "user", c.Username, "port", port)
	log.Info("port forward opened")
	s.auditHTTP(r, auditForwardOpen, c.Username, target, http.StatusOK)
	s.touch(m.ID) // idle.go: a connection, and the client's traffic (countingConn), are activity
	opened := time.Now()
	err = tunnel.Pipe(near, far)
	log.Info("port forward closed", "err", err)
	s.audit(r.Context(), store.AuditEntry{Action: auditForwardClose, User: c.Username, Remote: clientIP(r), Target: target,
		Result: store.AuditOK, Duration: time.Since(opened).Milliseconds(), Bytes: near.n.Load()}, nil)
}

// stripCookie removes the cookie name from a request's Cookie headers.
func stripCookie(h http.Header, name string) {
	var keep []string
	for _, line := range h.Values("Cookie") {
		var parts []string
		for _, p := range strings.Split(line, ";") {
			k, _, _ := strings.Cut(strings.TrimSpace(p), "=")
			if k != name && strings.TrimSpace(p) != "" {
				parts = append(parts, strings.TrimSpace(p))
			}
		}
		if len(parts) > 0 {
			keep = append(keep, strings.Join(parts, "; "))
		}
	}
	h.Del("Cookie")
	for _, v := range keep {
		h.Add("Cookie", v)
	}
}

// appPage answers an app host's request with a small HTML page (never kloud's UI).
func appPage(w http.ResponseWriter, code int, title string, err error) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(code)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	fmt.Fprintf(w, "<!doctype html><title>%s</title><h1>%s</h1><p>%s</p>\n", html.EscapeString(title), html.EscapeString(title), html.EscapeString(msg))
}

// countingConn counts the bytes read and written through a tunnel (for the audit log) and
// notes activity (idle.go) on each read of the client's traffic. It keeps the tunnel's
// half-close (CloseWrite).
type countingConn struct {
	*tunnel.Conn
	n     atomic.Int64
	touch func() // nil: no activity noted
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	if n > 0 && c.touch != nil {
		c.touch()
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}
