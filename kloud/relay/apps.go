package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
)

// Web apps get their own origin, never kloud UI's: what a machine serves is the machine
// user's code, and on the UI's origin it would run with the user's kloud session. Each port of
// each machine is the host p<port>--m<machine id>.<apps host> (Options.AppsHost, `kloud serve
// --apps-host`, default "localhost": browsers resolve *.localhost to loopback; in production a
// wildcard DNS name of a domain that is not the UI's), on kloud's own listener and port. The UI's
// /open (session cookie) mints a one-time ticket and redirects to /__kloud/auth?ticket= on the
// app's host, which sets a host-only cookie (kloud_app: a token for that user and that host
// only, 1 h) and redirects to the path asked for. Every app request is authorised again (the
// owner, or a terminal or full share of the machine now), the kloud_app cookie is stripped, and
// the request (WebSocket upgrades included) is proxied through a tunnel of that user (ports.go).
// kloud's own session cookie is host-only on the UI's host, so an app never sees it.

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

type appTicket struct {
	user, machine, path string
	port                int
	exp                 time.Time
}

// initApps sets up the web apps' host names and their proxy.
func (h *Hub) initApps() error {
	pu, err := url.Parse(h.o.PublicURL)
	if err != nil {
		return fmt.Errorf("kloud: public url: %w", err)
	}
	h.scheme = pu.Scheme
	switch h.o.AppsHost {
	case "off", "-":
		h.appsOff = true
	default:
		host := h.o.AppsHost
		if host == "" {
			host = DefaultAppsHost
		}
		if name, port, err := net.SplitHostPort(host); err == nil {
			h.appsHost, h.appsPort = name, port
		} else {
			h.appsHost, h.appsPort = host, pu.Port()
		}
		h.appsHost = strings.ToLower(strings.Trim(h.appsHost, "."))
		if h.appsHost == "" || strings.ContainsAny(h.appsHost, "/:@ ") {
			return fmt.Errorf("kloud: apps host %q: want a host name (e.g. apps.example.com with a wildcard DNS record, or localhost)", h.o.AppsHost)
		}
		if strings.EqualFold(h.appsHost, pu.Hostname()) {
			// Host-only cookies keep kloud's session from the apps, but an app could set cookies
			// for the UI's domain: better another domain.
			h.log.Warn("web apps are subdomains of kloud UI's host: pass --apps-host with a domain other than the UI's", "apps_host", h.appsHost, "public_url", h.o.PublicURL)
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
			h.log.Info("app proxy", "machine", t.machine, "port", t.port, "user", t.user, "err", err)
			kloudhttp.Page(w, http.StatusBadGateway, "Port "+strconv.Itoa(t.port)+" is not reachable", err)
		},
	}
	return nil
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
func (h *Hub) AppURL(machineID string, port int) string {
	if h.appsOff {
		return ""
	}
	host := "p" + strconv.Itoa(port) + "--m" + machineID + "." + h.appsHost
	if h.appsPort != "" {
		host = net.JoinHostPort(host, h.appsPort)
	}
	return h.scheme + "://" + host + "/"
}

// match returns the machine id and port of an app host, or ok=false.
func (h *Hub) match(hostport string) (id string, port int, ok bool) {
	if h.appsOff {
		return "", 0, false
	}
	host := hostport
	if name, _, err := net.SplitHostPort(hostport); err == nil {
		host = name
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(host, "."+h.appsHost)
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

// appAudience is the audience of an app cookie's token: that host only.
func appAudience(id string, port int) string { return "app:p" + strconv.Itoa(port) + "--m" + id }

// ServeApp serves r if its host is a web app's (p<port>--m<id>.<apps host>) and reports
// whether it was; kloud calls it before its own routes.
func (h *Hub) ServeApp(w http.ResponseWriter, r *http.Request) bool {
	id, port, ok := h.match(r.Host)
	if !ok {
		return false
	}
	h.serveApp(w, r, id, port)
	return true
}

func (h *Hub) serveApp(w http.ResponseWriter, r *http.Request, id string, port int) {
	if r.URL.Path == appAuthPath {
		h.serveAuth(w, r, id, port)
		return
	}
	var user string
	if c, err := r.Cookie(appCookie); err == nil {
		if u, err := h.o.Tokens.Verify(r.Context(), c.Value, appAudience(id, port)); err == nil {
			user = u
		}
	}
	if user == "" {
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Upgrade") == "" {
			http.Redirect(w, r, h.openURL(id, port, r.URL.RequestURI()), http.StatusTemporaryRedirect)
			return
		}
		kloudhttp.Page(w, http.StatusUnauthorized, "Not logged in to this app", fmt.Errorf("open it from kloud first: %s", h.openURL(id, port, "/")))
		return
	}
	m, err := h.o.Access.Machine(r.Context(), user, id)
	if err == nil {
		err = mayForward(user, m)
	}
	if err != nil {
		kloudhttp.Page(w, http.StatusForbidden, "Access refused", err)
		return
	}
	h.touch(id) // a web app's request is activity
	ctx := context.WithValue(r.Context(), appTargetKey{}, appTarget{user: user, machine: id, port: port})
	h.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// openURL is the UI's entry to an app (it authenticates the browser on kloud's origin).
func (h *Hub) openURL(id string, port int, path string) string {
	return strings.TrimRight(h.o.PublicURL, "/") + "/api/machines/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port) + "/open?path=" + url.QueryEscape(path)
}

// serveAuth exchanges a one-time ticket for the app's cookie.
func (h *Hub) serveAuth(w http.ResponseWriter, r *http.Request, id string, port int) {
	t := r.URL.Query().Get("ticket")
	h.appMu.Lock()
	tk, ok := h.appTickets[t]
	delete(h.appTickets, t)
	h.appMu.Unlock()
	if !ok || t == "" || time.Now().After(tk.exp) || tk.machine != id || tk.port != port {
		kloudhttp.Page(w, http.StatusForbidden, "Unknown, used or expired ticket", fmt.Errorf("open the app again from kloud: %s", h.openURL(id, port, "/")))
		return
	}
	tok, err := h.o.Tokens.Sign(tk.user, appAudience(id, port), appCookieTTL)
	if err != nil {
		kloudhttp.Page(w, http.StatusInternalServerError, "Could not sign the app cookie", err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: appCookie, Value: tok, Path: "/", MaxAge: int(appCookieTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: h.scheme == "https"})
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, tk.path, http.StatusSeeOther)
}

// ServeOpen is GET /api/machines/{id}/ports/{port}/open (on kloud's origin, with the user's
// session): it sends the browser to the app's host with a one-time ticket.
func (h *Hub) ServeOpen(w http.ResponseWriter, r *http.Request) {
	if h.appsOff {
		kloudhttp.WriteError(w, http.StatusNotFound, "web apps are off on this kloud (kloud serve --apps-host): use kloud port-forward")
		return
	}
	port, err := pathPort(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	path := r.URL.Query().Get("path")
	if path == "" || path[0] != '/' || strings.HasPrefix(path, "//") || strings.HasPrefix(path, `/\`) {
		path = "/"
	}
	user, m, err := h.target(r, mayForward)
	if user != "" {
		h.attempt(r, ActionAppOpen, user, portTarget(r, port), Status(err))
	}
	if err != nil {
		if Status(err) == http.StatusUnauthorized {
			// A navigation from another site carries no (SameSite=Strict) session cookie: one
			// click on kloud's own page does.
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `<!doctype html><title>Open port %d</title><p>Log in to <a href="/">kloud</a>, then <a href="%s">open port %d of machine %s</a>.</p>`,
				port, html.EscapeString(r.URL.RequestURI()), port, html.EscapeString(r.PathValue("id")))
			return
		}
		writeErr(w, err)
		return
	}
	t := rand.Text()
	h.appMu.Lock()
	now := time.Now()
	for k, v := range h.appTickets {
		if now.After(v.exp) {
			delete(h.appTickets, k)
		}
	}
	h.appTickets[t] = appTicket{user: user, machine: m.ID, port: port, path: path, exp: now.Add(appTicketTTL)}
	h.appMu.Unlock()
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, strings.TrimRight(h.AppURL(m.ID, port), "/")+appAuthPath+"?ticket="+url.QueryEscape(t), http.StatusSeeOther)
}

// dial opens a tunnel for a pooled app connection; addr names user, machine and port
// (appTarget.dialHost).
func (h *Hub) dial(ctx context.Context, _, addr string) (net.Conn, error) {
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
	m, err := h.o.Access.Machine(ctx, string(user), parts[1][1:])
	if err != nil {
		return nil, err
	}
	return h.openPort(ctx, string(user), m, port)
}

// stripCookie removes the cookie name from a request's Cookie headers.
func stripCookie(hd http.Header, name string) {
	var keep []string
	for _, line := range hd.Values("Cookie") {
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
	hd.Del("Cookie")
	for _, v := range keep {
		hd.Add("Cookie", v)
	}
}
