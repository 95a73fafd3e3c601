package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/model"
)

// Options configure a Hub. Access, Agents and Tokens are required.
type Options struct {
	Access Access // who calls, and the machine they name
	Agents Agents // machines' klients
	Tokens Tokens // the tokens klient checks and app cookies carry

	// PublicURL is kloud's public URL: the origin of the UI (a web app's way back to it) and
	// the scheme of app URLs. Required.
	PublicURL string
	// AppsHost names machines' web apps: p<port>--m<machine id>.<AppsHost>[:port]. Default
	// DefaultAppsHost; "off" or "-": no web apps.
	AppsHost string
	// Browser: the browser origins allowed besides the request's own host and PublicURL's
	// (kloudhttp.Browser.AllowedOrigins). Zero: same-origin only.
	Browser kloudhttp.Browser

	// KeepHostKey records a machine's SSH host key as its klient reported it (ssh.go), so
	// config-ssh pins it while the machine is stopped; nil: not kept.
	KeepHostKey func(ctx context.Context, machineID, key string) error

	// Replica is this kloud replica's id when several share a store behind a load balancer
	// (kloud/mesh.go): tickets start with it, so the replica klient's attachment lands on
	// (through the balancer) knows which replica waits for it. "": a single kloud.
	Replica string
	// Peer returns the internal URL of the live replica with id (an attachment for another
	// replica's ticket is proxied there); nil: such attachments are refused.
	Peer func(ctx context.Context, replica string) (string, error)
	// PeerTLS is what the proxy to another replica trusts for an https internal URL (nil: the
	// system's roots).
	PeerTLS *tls.Config

	Audit    Auditor                // nil: nothing recorded
	Activity func(machineID string) // activity on a machine (the idle stop's); nil: none
	Metrics  Metrics                // counters; nil ones count nothing
	Logger   *slog.Logger           // nil: discard
}

// Access authenticates users and loads the machines they name. Errors carry kite's sentinels
// (kite.ErrNotFound for a machine the user may not see, kite.ErrStoreUnavailable, ...) or an
// HTTP status (an error with an HTTPStatus() int method, e.g. 401 for no credential).
type Access interface {
	// Request authenticates r (kloud's session cookie, or "Authorization: Bearer" with a session
	// or a user's kite key; machine agents' keys are refused) and loads machine id as that user
	// sees it. user is set once r is authenticated, with or without an error: the audit log
	// records a known user's attempts.
	Request(r *http.Request, id string) (user string, m *model.Machine, err error)
	// Machine loads machine id as user sees it (a web app's cookie names its user).
	Machine(ctx context.Context, user, id string) (*model.Machine, error)
}

// Agents reaches machines' klients.
type Agents interface {
	// Agent is a caller of m's agent now: its connection, or a forwarder to the kloud replica
	// that holds it (kite.ErrState when none does).
	Agent(ctx context.Context, m *model.Machine) (Agent, error)
	// KloudURL is the origin m's klient reaches kloud at (its kontrol's: the one klient accepts
	// attach URLs on).
	KloudURL(m *model.Machine) string
}

// Agent calls a machine's klient (a *kite.Conn, or kloud's forwarder to another replica).
type Agent interface {
	Call(ctx context.Context, method string, params, result any) error
}

// Tokens signs and checks the short tokens of a user for one audience (kontrol's keys).
type Tokens interface {
	// Sign is a token of user for audience (klient's kite id, an app host) valid for ttl.
	Sign(user, audience string, ttl time.Duration) (string, error)
	// Verify checks raw for audience and returns its user.
	Verify(ctx context.Context, raw, audience string) (user string, err error)
}

// Auditor records what users did through the relay (kloud's audit log).
type Auditor interface {
	// Attempt records action of user on target, answered with an HTTP status (200: ok).
	Attempt(r *http.Request, action, user, target string, status int)
	// Closed records the end of a connection of r's user on target: how long it was open and
	// the bytes relayed both ways.
	Closed(r *http.Request, action, user, target string, d time.Duration, bytes int64)
}

// Metrics are the counters the relay adds to.
type Metrics struct {
	TerminalBytesIn  prometheus.Counter // terminal bytes from browsers to klient
	TerminalBytesOut prometheus.Counter // terminal bytes from klient to browsers
}

// The audit log's actions of the relay.
const (
	ActionTerminalOpen   = "terminal.open"
	ActionTerminalClose  = "terminal.close"
	ActionTerminalKill   = "terminal.kill"
	ActionTerminalRename = "terminal.rename"
	ActionForwardOpen    = "portforward.open"
	ActionForwardClose   = "portforward.close"
	ActionAppOpen        = "app.open"
)

// Hub relays terminals, port forwards and web apps between users and machines' klients.
type Hub struct {
	o   Options
	log *slog.Logger

	// terminal.go: klient's attachments (terminals and tunnels) and the relays.
	mu      sync.Mutex
	pending map[string]chan attachment // ticket → the request waiting for klient
	relays  map[*termRelay]struct{}
	closed  bool
	byCred  map[string]map[*int]func() // revoke.go: closers of open connections by credential id

	// apps.go: web apps on their own hosts.
	appsHost   string // the apps host name (lower case, no port), "" when off
	appsPort   string // the port app URLs name ("" for the scheme's default)
	scheme     string // http or https, as the public URL's
	appsOff    bool
	proxy      *httputil.ReverseProxy
	tr         *http.Transport
	appMu      sync.Mutex
	appTickets map[string]appTicket

	peerTr *http.Transport // replicas.go: attachments proxied to the replica waiting for them
}

// New returns a Hub; it relays until Run's context ends.
func New(o Options) (*Hub, error) {
	if o.Access == nil || o.Agents == nil || o.Tokens == nil {
		return nil, errors.New("relay: Options.Access, Agents and Tokens are required")
	}
	h := &Hub{o: o, log: o.Logger, pending: map[string]chan attachment{}, relays: map[*termRelay]struct{}{},
		appTickets: map[string]appTicket{}}
	if h.log == nil {
		h.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h.peerTr = &http.Transport{TLSClientConfig: o.PeerTLS, IdleConnTimeout: 30 * time.Second, ForceAttemptHTTP2: false}
	if err := h.initApps(); err != nil {
		return nil, err
	}
	return h, nil
}

// Run waits for ctx to end (kloud shuts down), then closes every terminal and refuses new ones,
// and drops the web apps' idle tunnels.
func (h *Hub) Run(ctx context.Context) {
	<-ctx.Done()
	h.closeAll()
	h.tr.CloseIdleConnections()
}

// touch notes activity on machine id.
func (h *Hub) touch(id string) {
	if h.o.Activity != nil {
		h.o.Activity(id)
	}
}

func (h *Hub) attempt(r *http.Request, action, user, target string, status int) {
	if h.o.Audit != nil {
		h.o.Audit.Attempt(r, action, user, target, status)
	}
}

func (h *Hub) closedAudit(r *http.Request, action, user, target string, d time.Duration, bytes int64) {
	if h.o.Audit != nil {
		h.o.Audit.Closed(r, action, user, target, d, bytes)
	}
}

// statusError is an error with the HTTP status it answers.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string   { return e.msg }
func (e *statusError) HTTPStatus() int { return e.code }

// Status is the HTTP status err answers with: its own (an HTTPStatus() int method), else the
// one of its kite code; 200 for nil.
func Status(err error) int {
	if err == nil {
		return http.StatusOK
	}
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) {
		return hs.HTTPStatus()
	}
	switch {
	case errors.Is(err, kite.ErrInvalidParams):
		return http.StatusBadRequest
	case errors.Is(err, kite.ErrAuth), errors.Is(err, kite.ErrPermission):
		return http.StatusForbidden
	case errors.Is(err, kite.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, kite.ErrConflict), errors.Is(err, kite.ErrState):
		return http.StatusConflict
	case errors.Is(err, kite.ErrStoreUnavailable): // before timeouts: it wraps the driver's deadline
		return http.StatusServiceUnavailable
	case errors.Is(err, kite.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// writeErr answers err as JSON with its status.
func writeErr(w http.ResponseWriter, err error) { kloudhttp.WriteError(w, Status(err), err.Error()) }

// Role is what user may do on m: "owner", a share grant (model.GrantReadonly, ...), or ""
// (nothing: kloud admins and team admins too, klient would refuse them).
func Role(user string, m *model.Machine) string {
	if m.Owner == user {
		return "owner"
	}
	for _, sh := range m.Shares {
		if sh.Username == user {
			return sh.Grant
		}
	}
	return ""
}

// target authenticates r and loads the machine it names ({id}), which the user must be able to
// use (allowed: nil when it may, else why not). On an error after the user is known, it
// returns the user too (for the audit log).
func (h *Hub) target(r *http.Request, allowed func(user string, m *model.Machine) error) (string, *model.Machine, error) {
	user, m, err := h.o.Access.Request(r, r.PathValue("id"))
	if err != nil {
		if errors.Is(err, kite.ErrNotFound) {
			return user, nil, &statusError{http.StatusNotFound, err.Error()}
		}
		return user, nil, err
	}
	if err := allowed(user, m); err != nil {
		return user, nil, &statusError{http.StatusForbidden, err.Error()}
	}
	return user, m, nil
}

// userToken mints the token klient checks: the user, for this machine's klient only.
func (h *Hub) userToken(user string, m *model.Machine) (string, error) {
	return h.o.Tokens.Sign(user, m.KiteID, terminalTokenTTL)
}

// attachURL is the attach endpoint on the origin the machine's klient reaches kloud at.
func (h *Hub) attachURL(m *model.Machine) string {
	return strings.TrimRight(h.o.Agents.KloudURL(m), "/") + klientapi.AttachPath
}

// sameOrigin accepts requests without an Origin (not a browser), browsers on this host or the
// public URL's, and the allowed origins (kloudhttp.Browser.OriginAllowed).
func (h *Hub) sameOrigin(r *http.Request) bool {
	return h.o.Browser.OriginAllowed(r, h.o.PublicURL)
}
