package kite

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"

	"github.com/kloud-dev/kloud/kite/frame"
	"github.com/kloud-dev/kloud/kite/wsframe"
)

// Subprotocol is the WebSocket subprotocol of kite protocol v1.
const Subprotocol = "kite.v1"

// Options configures a Kite. Zero fields take the documented defaults.
type Options struct {
	// Identity of this kite. Name is required. ID defaults to a random UUID, Hostname to
	// os.Hostname, Environment and Region to "default", Version to "0.0.0", Username to "kloud".
	Identity Identity
	// Authenticator checks the credentials of kites that dial this one. Nil: every handshake is
	// rejected, only public methods (kite.ping) are served.
	Authenticator Authenticator
	// GateBuiltins, when set, wraps the built-in methods that need authentication
	// (kite.systemInfo, kite.methods) the way the server wraps its own: kloud and kontrol pass
	// kitekey.AgentGate(h, false), so machine agents are refused those too. Nil: served to any
	// authenticated peer.
	GateBuiltins func(Handler) Handler
	Logger       *slog.Logger // default: discard
	// MaxFrameSize bounds one JSON-RPC frame in either direction (default 4 MiB). A peer that
	// sends more is disconnected with close code 1009.
	MaxFrameSize int64
	// PingInterval and PingTimeout drop a peer that stops answering WebSocket pings
	// (defaults 15s and 10s; a negative interval turns pings off).
	PingInterval, PingTimeout time.Duration
	// CallTimeout is the deadline of outgoing calls whose ctx has none (default 30s).
	CallTimeout time.Duration
	// ConnectTimeout bounds the TCP connect of Dial (default 0: net/http's, 30s). A reconnecting
	// client that sets it short (klient: 1s) tries a fresh SYN at its own pace after a network
	// cut instead of waiting out the kernel's SYN retransmissions (1, 3, 7, 15 s).
	ConnectTimeout time.Duration
	// RateLimitedRetry is how long, in all, an outgoing call refused with ErrRateLimited
	// (-32007: nothing of it ran) may wait the retry time the peer names and be sent again,
	// within its ctx; a refusal naming a longer wait is returned at once, as is every refusal
	// when it is 0 (the default). The kloud CLI sets it,
	// so that a script that calls kloud in a loop is slowed down rather than failed.
	RateLimitedRetry time.Duration
	// HandlerTimeout bounds how long a handler may run (default 5m; per method: WithTimeout).
	HandlerTimeout time.Duration
	// HandshakeTimeout closes served connections that do not complete kite.handshake in time
	// (default 10s).
	HandshakeTimeout time.Duration
	// WriteTimeout bounds writing one frame (default 10s).
	WriteTimeout time.Duration
	// MaxConcurrent bounds the calls served at once per connection (default 256).
	MaxConcurrent int
	// OriginPatterns are extra browser origins allowed to connect (same-origin is always allowed).
	OriginPatterns []string
	// OnHandshake runs after a served connection authenticated, before the handshake result is
	// sent; an error rejects the handshake.
	OnHandshake func(ctx context.Context, c *Conn) error
	// OnDisconnect runs when a served or dialed connection closes.
	OnDisconnect func(c *Conn)
	// Observer, if set, is told about served calls and rejected handshakes (metrics).
	Observer Observer
	// TLSConfig is what Dial trusts for wss:// and https:// URLs (internal/tlsconf.Client: the
	// system's roots plus kloud's CA). Nil: Go's defaults (the system's roots).
	TLSConfig *tls.Config
}

func (o *Options) setDefaults() error {
	if o.Identity.Name == "" {
		return errors.New("kite: Options.Identity.Name is required")
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	host, _ := os.Hostname()
	def(&o.Identity.ID, uuid.NewString())
	def(&o.Identity.Hostname, host)
	def(&o.Identity.Hostname, "localhost")
	def(&o.Identity.Environment, "default")
	def(&o.Identity.Region, "default")
	def(&o.Identity.Version, "0.0.0")
	def(&o.Identity.Username, "kloud")
	if err := o.Identity.Validate(true); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if o.MaxFrameSize <= 0 {
		o.MaxFrameSize = 4 << 20
	}
	dur(&o.PingInterval, 15*time.Second)
	dur(&o.PingTimeout, 10*time.Second)
	dur(&o.CallTimeout, 30*time.Second)
	dur(&o.HandlerTimeout, 5*time.Minute)
	dur(&o.HandshakeTimeout, 10*time.Second)
	dur(&o.WriteTimeout, 10*time.Second)
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 256
	}
	return nil
}

// Kite serves kite connections and dials other kites.
type Kite struct {
	opts Options
	log  *slog.Logger

	mu      sync.RWMutex
	methods map[string]*method
	notifs  map[string]func(*Conn, []byte)
	conns   map[*Conn]struct{}
	closed  bool
	// hc dials with Options.TLSConfig (nil without one: net/http's default client).
	hc *http.Client
}

type method struct {
	h       Handler
	public  bool
	timeout time.Duration
	limiter *limiter
}

// MethodOption changes how one method is served.
type MethodOption func(*method)

// Public serves the method without authentication (kite.ping is the only built-in one).
func Public() MethodOption { return func(m *method) { m.public = true } }

// WithTimeout overrides Options.HandlerTimeout for the method.
func WithTimeout(d time.Duration) MethodOption { return func(m *method) { m.timeout = d } }

// Throttle limits the method to r calls per second with bursts of b, across all callers;
// calls over the limit fail with ErrRateLimited.
func Throttle(r float64, b int) MethodOption {
	return func(m *method) { m.limiter = &limiter{rate.NewLimiter(rate.Limit(r), b)} }
}

type limiter struct{ l *rate.Limiter }

func (l *limiter) allow() bool { return l.l.Allow() }

// New makes a Kite with the built-in methods kite.handshake, kite.ping, kite.systemInfo and
// kite.methods.
func New(opts Options) (*Kite, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	k := &Kite{
		opts:    opts,
		log:     opts.Logger.With("kite", opts.Identity.Name),
		methods: map[string]*method{},
		notifs:  map[string]func(*Conn, []byte){},
		conns:   map[*Conn]struct{}{},
	}
	if opts.TLSConfig != nil || opts.ConnectTimeout > 0 {
		t := http.DefaultTransport.(*http.Transport).Clone()
		if opts.TLSConfig != nil {
			t.TLSClientConfig = opts.TLSConfig.Clone()
		}
		if opts.ConnectTimeout > 0 {
			t.DialContext = (&net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
		}
		k.hc = &http.Client{Transport: t}
	}
	k.builtins()
	return k, nil
}

// Identity returns this kite's identity.
func (k *Kite) Identity() Identity { return k.opts.Identity }

// Options returns the options in effect (with defaults filled in).
func (k *Kite) Options() Options { return k.opts }

// Logger returns the kite's logger.
func (k *Kite) Logger() *slog.Logger { return k.log }

// Handle registers h for method. It panics if the method is already registered.
func (k *Kite) Handle(name string, h Handler, opts ...MethodOption) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, dup := k.methods[name]; dup {
		panic("kite: method registered twice: " + name)
	}
	m := &method{h: h}
	for _, o := range opts {
		o(m)
	}
	k.methods[name] = m
}

// HandleFunc registers a function for method.
func (k *Kite) HandleFunc(name string, f func(ctx context.Context, r *Request) (any, error), opts ...MethodOption) {
	k.Handle(name, HandlerFunc(f), opts...)
}

// HandleNotification registers a function for notifications of method that are not part of a
// stream. It runs in the connection's read loop, so it must not block.
func (k *Kite) HandleNotification(name string, f func(c *Conn, params []byte)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.notifs[name] = f
}

func (k *Kite) lookup(name string) *method {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.methods[name]
}

func (k *Kite) lookupNotification(name string) func(*Conn, []byte) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.notifs[name]
}

// Methods returns the registered method names, sorted.
func (k *Kite) Methods() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]string, 0, len(k.methods))
	for n := range k.methods {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Conns returns the open connections.
func (k *Kite) Conns() []*Conn {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]*Conn, 0, len(k.conns))
	for c := range k.conns {
		out = append(out, c)
	}
	return out
}

func (k *Kite) track(c *Conn) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	k.conns[c] = struct{}{}
	return true
}

func (k *Kite) forget(c *Conn) {
	k.mu.Lock()
	_, ok := k.conns[c]
	delete(k.conns, c)
	k.mu.Unlock()
	if ok && k.opts.OnDisconnect != nil {
		k.opts.OnDisconnect(c)
	}
}

// Close closes every connection and refuses new ones.
func (k *Kite) Close() error {
	k.mu.Lock()
	k.closed = true
	conns := make([]*Conn, 0, len(k.conns))
	for c := range k.conns {
		conns = append(conns, c)
	}
	k.mu.Unlock()
	for _, c := range conns {
		c.Close(nil)
	}
	return nil
}

// ServeHTTP accepts a kite connection (GET /kite upgraded to WebSocket, subprotocol kite.v1).
func (k *Kite) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fs, err := wsframe.Accept(w, r, wsframe.AcceptOptions{
		Subprotocol: Subprotocol, OriginPatterns: k.opts.OriginPatterns, MaxFrame: k.opts.MaxFrameSize,
	})
	if err != nil {
		k.log.Debug("kite accept", "remote", r.RemoteAddr, "err", err)
		return
	}
	k.ServeFrames(fs, r.RemoteAddr)
}

// ServeFrames serves a kite connection over an established frame stream and returns at once.
func (k *Kite) ServeFrames(fs frame.Stream, remote string) *Conn {
	c := newConn(k, fs, false, remote)
	if !k.track(c) {
		c.Close(errors.New("kite is closing"))
		return c
	}
	time.AfterFunc(k.opts.HandshakeTimeout, func() {
		if !c.ready.Load() && c.ctx.Err() == nil {
			if k.opts.Observer != nil {
				k.opts.Observer.HandshakeRejected(RejectTimeout)
			}
			c.Close(fmt.Errorf("no kite.handshake within %s", k.opts.HandshakeTimeout))
		}
	})
	return c
}

// Dial connects to the kite at url (ws://, wss://, http:// or https://, path included, e.g.
// http://127.0.0.1:7000/kite), performs the handshake with auth and returns the connection.
func (k *Kite) Dial(ctx context.Context, url string, auth Auth) (*Conn, error) {
	fs, err := wsframe.Dial(ctx, url, Subprotocol, k.opts.MaxFrameSize, k.hc)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", url, err)
	}
	return k.DialFrames(ctx, fs, url, auth)
}

// DialFrames runs the client side of a connection over an established frame stream: it sends
// kite.handshake with auth and returns the connection once the server accepted it.
func (k *Kite) DialFrames(ctx context.Context, fs frame.Stream, remote string, auth Auth) (*Conn, error) {
	c := newConn(k, fs, true, remote)
	if !k.track(c) {
		c.Close(errors.New("kite is closing"))
		return nil, errors.New("kite: closed")
	}
	var res HandshakeResult
	err := c.Call(ctx, "kite.handshake", HandshakeParams{Kite: k.opts.Identity, Auth: auth}, &res)
	if err != nil {
		c.Close(err)
		return nil, fmt.Errorf("handshake with %s: %w", remote, err)
	}
	c.mu.Lock()
	c.peer = res.Kite
	c.principal = &Principal{Username: res.Kite.Username, Type: "dialed", KiteID: res.Kite.ID}
	c.mu.Unlock()
	c.ready.Store(true)
	return c, nil
}
