package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider"
)

// HostOptions configure a Host. Zero fields take the documented defaults.
type HostOptions struct {
	// Registry is kloud's provider registry; required. The Host Replaces a proxy into it for
	// every plugin that registers. Providers already in it when a plugin of the same name (or
	// resource type) registers are in-tree, and the plugin is refused.
	Registry *provider.Registry
	Logger   *slog.Logger // default: discard
	// KloudVersion is sent to plugins in plugin.register's result.
	KloudVersion string
	// CallTimeout bounds a call to a plugin whose ctx has no deadline (default 1h: a machine
	// start may take minutes; kloud's jobs set their own deadlines).
	CallTimeout time.Duration
	// AvailableTimeout bounds provider.available, which Provider.Available (no ctx) calls
	// (default 5s).
	AvailableTimeout time.Duration
	// RestartWait bounds how long a call to a plugin that is not connected waits for it to
	// (re)connect, counted from when it went down (its connection closed, or kloud started
	// expecting it): a launched plugin that was killed is restarted within a second or two, a
	// remote one redials. Within the bound a call waits (up to its ctx); after it, calls fail at
	// once with "provider NAME (plugin) is not connected: <last error>". Default 1m (the same
	// bound as kloud's wait for a restarting terraformer); negative: never wait.
	RestartWait time.Duration
	// Peers reaches the plugins connected to other kloud replicas (peers.go); nil: none.
	Peers Peers
}

// Host is kloud's side of provider plugins: it accepts their registrations (Register is the body
// of the plugin.register method), keeps one connection per provider name, puts a proxy
// *provider.Provider for each into the Registry, and reports their status.
type Host struct {
	o   HostOptions
	log *slog.Logger

	mu      sync.Mutex
	plugins map[string]*plug
	changed chan struct{} // closed and replaced whenever a plugin connects
}

// plug is one plugin name's state. Guarded by Host.mu.
type plug struct {
	name           string
	where          string // set by Expect (launched) or from the connection (remote)
	launched       bool
	conn           *kite.Conn
	apiVersion     int
	version        string
	manifest       Manifest
	connectedAt    time.Time
	disconnectedAt time.Time
	downSince      time.Time // when it went down (lost, or Expect before it connected); zero while connected
	lastErr        string
	proxy          *provider.Provider
	session        string      // this replica's connection's, for Peers; "" while not connected here
	peer           *PeerPlugin // its connection on another replica, while not connected here (SetPeers, Locate)
}

// Status is one plugin as `kloud provider list` shows it.
type Status struct {
	Name           string                `json:"name"`
	Version        string                `json:"version,omitempty"`    // the plugin's own version
	APIVersion     int                   `json:"apiVersion,omitempty"` // the plugin API version in use
	Where          string                `json:"where"`                // "launched (pid N)" / "remote 1.2.3.4:5"
	Connected      bool                  `json:"connected"`
	ConnectedAt    time.Time             `json:"connectedAt,omitzero"`
	DisconnectedAt time.Time             `json:"disconnectedAt,omitzero"`
	LastError      string                `json:"lastError,omitempty"`
	Capabilities   []provider.Capability `json:"capabilities"`
	// Replica is the kloud replica holding its connection when another one does (several
	// replicas: this one forwards its calls there).
	Replica string `json:"replica,omitempty"`
}

// NewHost makes a Host over o.Registry.
func NewHost(o HostOptions) *Host {
	if o.Registry == nil {
		panic("plugin: NewHost needs a Registry")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = time.Hour
	}
	if o.AvailableTimeout <= 0 {
		o.AvailableTimeout = 5 * time.Second
	}
	if o.RestartWait == 0 {
		o.RestartWait = time.Minute
	}
	return &Host{o: o, log: o.Logger.With("component", "plugins"), plugins: map[string]*plug{}, changed: make(chan struct{})}
}

// negotiate picks the highest plugin API version both sides speak.
func negotiate(theirs []int) (int, bool) {
	best := 0
	for _, v := range theirs {
		if slices.Contains(supported, v) && v > best {
			best = v
		}
	}
	return best, best > 0
}

// Register is the body of plugin.register (route it with kitekey.Gate(h, kitekey.KindPluginKey)):
// the caller must hold the plugin key of the provider it registers; the name must not be an
// in-tree provider's, nor its resource type another provider's; the plugin must speak an API
// version kloud speaks. The proxy is then installed (or replaced) in the registry, a connection
// already serving that name is closed, and the connection is watched: when it closes, the
// proxy stays registered and its calls wait for the plugin to be back, up to RestartWait after
// it went down, then fail fast with kite.ErrUnavailable until it is.
func (h *Host) Register(ctx context.Context, r *kite.Request, p *RegisterParams) (*RegisterResult, error) {
	pr := r.Principal()
	name := kitekey.PluginName(pr)
	if name == "" {
		return nil, fmt.Errorf("%s needs a plugin key (mint one with `kloud key create --provider NAME`): %w", MethodRegister, kite.ErrPermission)
	}
	err := p.Check()
	if err == nil {
		err = compileSchemas(&p.Provider)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", MethodRegister, err.Error(), kite.ErrInvalidParams)
	}
	m := p.Provider
	if m.Name != name {
		return nil, fmt.Errorf("%s: this plugin key is for provider %q, not %q: %w", MethodRegister, name, m.Name, kite.ErrPermission)
	}
	v, ok := negotiate(p.Versions)
	if !ok {
		return nil, fmt.Errorf("%s: provider %s: plugin speaks plugin API versions %v, kloud speaks %v: build the plugin against a provider/plugin package of a matching kloud: %w",
			MethodRegister, name, p.Versions, supported, kite.ErrInvalidParams)
	}

	h.mu.Lock()
	e := h.plugins[name]
	if err := h.taken(e, name, m.ResourceType); err != nil {
		h.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", MethodRegister, err)
	}
	if e == nil {
		e = &plug{name: name}
		h.plugins[name] = e
	}
	old, oldSession := e.conn, e.session
	e.conn, e.apiVersion, e.version, e.manifest = r.Conn, v, p.PluginVersion, m
	e.connectedAt, e.lastErr, e.downSince = time.Now().UTC(), "", time.Time{}
	e.session, e.peer = newSession(), nil
	rec := PeerPlugin{Name: name, Session: e.session, Manifest: m, Version: p.PluginVersion, APIVersion: v, ConnectedAt: e.connectedAt}
	if !e.launched {
		e.where = "remote " + r.Conn.Remote()
	}
	e.proxy = h.newProxy(name, m)
	e.proxy.Version = p.PluginVersion
	h.o.Registry.Replace(e.proxy)
	close(h.changed)
	h.changed = make(chan struct{})
	rec.Where = e.where
	h.mu.Unlock()
	if old != nil && oldSession != "" {
		h.forget(name, oldSession)
	}
	h.announce(ctx, rec) // peers.go: other replicas forward its calls here

	if old != nil && old != r.Conn {
		// Tell the older plugin first, so that it stops instead of dialing back in to replace
		// this one.
		why := fmt.Sprintf("provider %s registered again from %s", name, r.Conn.Remote())
		nctx, cancel := context.WithTimeout(ctx, time.Second)
		old.Notify(nctx, notifyReplaced, replacedParams{Reason: why})
		cancel()
		old.Close(errors.New(why))
	}
	c := r.Conn
	c.OnClose(func() { h.lost(name, c) })
	h.log.Info("provider plugin registered", "provider", name, "version", p.PluginVersion, "apiVersion", v, "where", rec.Where,
		"capabilities", m.Capabilities)
	return &RegisterResult{Version: v, KloudVersion: h.o.KloudVersion}, nil
}

// taken says why plugin name (e: its entry, nil if none) may not be installed in the registry
// (h.mu held): its name is an in-tree provider's, or its resource type another provider's.
func (h *Host) taken(e *plug, name, resourceType string) error {
	if cur, err := h.o.Registry.Lookup(name); err == nil && (e == nil || e.proxy == nil || cur != e.proxy) {
		return fmt.Errorf("provider %s is built into this kloud; a plugin cannot replace it (rename the plugin): %w", name, kite.ErrConflict)
	}
	if other := h.o.Registry.ByResourceType(resourceType); other != nil && other.Name != name {
		return fmt.Errorf("resource type %s is provider %s's: %w", resourceType, other.Name, kite.ErrConflict)
	}
	return nil
}

// withCallTimeout bounds ctx by CallTimeout if it has no deadline.
func (h *Host) withCallTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, h.o.CallTimeout)
}

// lost marks name disconnected if c is still its connection.
func (h *Host) lost(name string, c *kite.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.plugins[name]
	if e == nil || e.conn != c {
		return
	}
	e.conn, e.disconnectedAt, e.downSince = nil, time.Now().UTC(), time.Now()
	h.forget(name, e.session)
	e.session = ""
	reason := "connection closed"
	if err := c.Err(); err != nil && !errors.Is(err, kite.ErrClosed) {
		reason = "connection lost: " + err.Error()
	}
	e.lastErr = reason
	h.log.Warn("provider plugin disconnected", "provider", name, "reason", reason)
}

// Expect lists a plugin kloud launches before it has dialed in: Status shows it (not connected)
// with where (e.g. "launched (pid 1234)"), and it keeps that where once connected. Call it again
// when the process is restarted.
func (h *Host) Expect(name, where string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.plugins[name]
	if e == nil {
		e = &plug{name: name}
		h.plugins[name] = e
	}
	e.where, e.launched = where, true
	if e.conn == nil && e.downSince.IsZero() {
		e.downSince = time.Now()
	}
}

// SetError records the supervisor's last error for name (a crash, an exit status); Status shows
// it and calls on a disconnected proxy quote it.
func (h *Host) SetError(name string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.plugins[name]
	if e == nil {
		e = &plug{name: name}
		h.plugins[name] = e
	}
	if err != nil {
		e.lastErr = err.Error()
	} else {
		e.lastErr = ""
	}
}

// Served reports how long the plugin name was connected in its last connection begun after
// since (until it disconnected, or until now while it is connected); 0 if it has not connected
// since then. A supervisor uses it to tell a plugin that served from one that crash-loops: the
// time a slow start took does not count.
func (h *Host) Served(name string, since time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.plugins[name]
	if e == nil || e.connectedAt.Before(since) {
		return 0
	}
	if e.conn != nil || e.disconnectedAt.Before(e.connectedAt) {
		return time.Since(e.connectedAt)
	}
	return e.disconnectedAt.Sub(e.connectedAt)
}

// Wait waits until the plugin name is connected and registered, or ctx ends.
func (h *Host) Wait(ctx context.Context, name string) error {
	for {
		h.mu.Lock()
		e, ch := h.plugins[name], h.changed
		if e != nil && e.conn != nil {
			h.mu.Unlock()
			return nil
		}
		last := ""
		if e != nil {
			last = e.lastErr
		}
		h.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			if last != "" {
				return fmt.Errorf("provider %s (plugin) did not connect: %w (last error: %s)", name, ctx.Err(), last)
			}
			return fmt.Errorf("provider %s (plugin) did not connect: %w", name, ctx.Err())
		}
	}
}

// Status lists every plugin the Host knows (registered once, or expected), by name.
func (h *Host) Status() []Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Status, 0, len(h.plugins))
	for _, e := range h.plugins {
		caps := slices.Clone(e.manifest.Capabilities)
		if caps == nil {
			caps = []provider.Capability{}
		}
		st := Status{Name: e.name, Version: e.version, APIVersion: e.apiVersion, Where: e.where, Connected: e.conn != nil,
			ConnectedAt: e.connectedAt, DisconnectedAt: e.disconnectedAt, LastError: e.lastErr, Capabilities: caps}
		if p := e.peer; e.conn == nil && p != nil {
			st.Version, st.APIVersion, st.Where, st.Connected, st.ConnectedAt, st.LastError = p.Version, p.APIVersion, p.Where, true, p.ConnectedAt, ""
			st.Replica = p.Replica
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Manifest returns what the plugin name registered with (false if it never did).
func (h *Host) Manifest(name string) (Manifest, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.plugins[name]
	if e == nil || e.proxy == nil {
		return Manifest{}, false
	}
	return e.manifest, true
}

// IsPlugin reports whether p is a proxy this Host installed (the provider is a plugin).
func (h *Host) IsPlugin(p *provider.Provider) bool {
	if p == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.plugins[p.Name]
	return e != nil && e.proxy == p
}

// noWait is the ctx key of a call that does not wait for a plugin that is down (Available).
type noWait struct{}

// conn returns name's connection here, or else (several replicas) the plugin's connection on
// another replica. While neither is there it waits for one, until RestartWait after it went down
// or ctx ends (a killed plugin is being restarted: the call then goes to the new process); then
// it returns the error every call on a disconnected proxy gets.
func (h *Host) conn(ctx context.Context, name string) (*kite.Conn, *PeerPlugin, error) {
	for {
		h.mu.Lock()
		e, changed := h.plugins[name], h.changed
		if e != nil && e.conn != nil {
			h.mu.Unlock()
			return e.conn, nil, nil
		}
		if e != nil && e.peer != nil {
			p := e.peer
			h.mu.Unlock()
			return nil, p, nil
		}
		last := "it has not registered"
		if e != nil && e.lastErr != "" {
			last = e.lastErr
		}
		var until time.Time
		if e != nil && !e.downSince.IsZero() && h.o.RestartWait > 0 {
			until = e.downSince.Add(h.o.RestartWait)
		}
		h.mu.Unlock()
		if h.o.Peers != nil {
			// Connected to another replica since its last heartbeat, or this replica's view was cut.
			if p, ok, err := h.o.Peers.Locate(ctx, name); err == nil && ok {
				h.setPeer(name, p)
				return nil, &p, nil
			}
		}
		wait := time.Until(until)
		if wait <= 0 || ctx.Err() != nil || ctx.Value(noWait{}) != nil {
			if !until.IsZero() && wait <= 0 {
				last += fmt.Sprintf(" (down for over %s)", h.o.RestartWait)
			}
			return nil, nil, fmt.Errorf("provider %s (plugin) is not connected: %s: %w", name, last, kite.ErrUnavailable)
		}
		if h.o.Peers != nil {
			wait = min(wait, time.Second) // look for it on the other replicas again
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// setPeer records p (found by Locate) as name's connection elsewhere, unless name connected
// here meanwhile.
func (h *Host) setPeer(name string, p PeerPlugin) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.plugins[name]; e != nil && e.conn == nil {
		e.peer = &p
	}
}

// dropPeer forgets p as name's connection elsewhere (the replica no longer holds it).
func (h *Host) dropPeer(name string, p *PeerPlugin) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.plugins[name]; e != nil && e.peer != nil && e.peer.Session == p.Session {
		e.peer = nil
		if e.conn == nil && e.downSince.IsZero() {
			e.downSince = time.Now()
		}
	}
}

// call makes one call to plugin name. A plugin's own error comes back as a plain error with its
// message (as an in-process provider's would), provider.ErrUnsupported, ErrConstraint and
// ErrBucketNotFound stay recognizable, and
// a missing or lost connection wraps kite.ErrUnavailable naming the provider and the reason.
// With several replicas, a plugin connected to another one is called there (Peers.Call): the
// same answers, and a call the other replica did not make (the plugin left it) is made again
// wherever the plugin is now.
func (h *Host) call(ctx context.Context, name, method string, params, result any) error {
	ctx, cancel := h.withCallTimeout(ctx)
	defer cancel()
	for tries := 0; ; tries++ {
		c, peer, err := h.conn(ctx, name)
		if err != nil {
			return err
		}
		if peer == nil {
			return h.mapErr(ctx, name, method, c.Call(ctx, method, params, result), c)
		}
		err = h.o.Peers.Call(ctx, *peer, method, params, result)
		if errors.Is(err, ErrPeerAway) {
			h.dropPeer(name, peer)
			if tries < 2 && ctx.Err() == nil {
				continue
			}
			return fmt.Errorf("provider %s (plugin) is not connected: %s: %w", name, err.Error(), kite.ErrUnavailable)
		}
		var ke *kite.Error
		if errors.As(err, &ke) && ke.Code == kite.CodeUnavailable && ke.Type() == ErrTypePeerLost {
			return fmt.Errorf("provider %s (plugin) disconnected during %s: %s: %w", name, method, ke.Message, kite.ErrUnavailable)
		}
		return h.mapErr(ctx, name, method, err, nil)
	}
}

// mapErr maps the error of a call on a plugin's connection (c; nil when it was made on another
// replica's): see call.
func (h *Host) mapErr(ctx context.Context, name, method string, err error, c *kite.Conn) error {
	switch {
	case err == nil:
		return nil
	case c != nil && (errors.Is(err, kite.ErrClosed) || c.Context().Err() != nil):
		reason := "connection closed"
		if cerr := c.Err(); cerr != nil && !errors.Is(cerr, kite.ErrClosed) {
			reason = cerr.Error()
		}
		return fmt.Errorf("provider %s (plugin) disconnected during %s: %s: %w", name, method, reason, kite.ErrUnavailable)
	case ctx.Err() != nil:
		return fmt.Errorf("provider %s (plugin): %w", name, err)
	}
	var ke *kite.Error
	if errors.As(err, &ke) {
		re := &remoteError{msg: ke.Message}
		if ke.Type() == typeUnsupported {
			re.is = provider.ErrUnsupported
		}
		remoteConstraint(re, ke) // constraints.go
		remoteBucket(re, ke)     // bucket.go
		return re
	}
	return fmt.Errorf("provider %s (plugin) %s: %w", name, method, err)
}

// remoteError is an error a plugin's provider returned: its message, and ErrUnsupported if it
// said so.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }
