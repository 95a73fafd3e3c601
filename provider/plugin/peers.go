package plugin

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kite"
)

// Several kloud replicas (docs/deployment.md): a plugin kloud launches is launched by every
// replica, but a remote plugin dials the balancer and lands on one. The replica it registered
// with records that it holds the connection (Peers.Connected); the others learn of it from the
// store (SetPeers, at each of kloud's heartbeats), put a proxy for it in their own registry, and
// forward each call to the replica that holds the connection (Peers.Call, which that replica
// answers with CallLocal). A call goes to this replica's own connection whenever it has one.

// Peers reaches the plugins connected to the other kloud replicas sharing this kloud's store
// (kloud/mesh.go). HostOptions.Peers nil: this kloud is alone, and a plugin's calls go to its
// connection here only.
type Peers interface {
	// Connected records that this replica holds p's connection (a registration).
	Connected(ctx context.Context, p PeerPlugin) error
	// Disconnected removes the record Connected wrote for session, if name's is still that one.
	Disconnected(ctx context.Context, name, session string)
	// Locate returns the connection of plugin name on another live replica, if one holds it.
	Locate(ctx context.Context, name string) (PeerPlugin, bool, error)
	// Call makes one call on p's connection, on the replica holding it (which answers with
	// CallLocal). The plugin's own errors come back as the *kite.Error it answered, and so does
	// CallLocal's ErrTypePeerLost; the plugin not (or no longer) being connected there
	// (ErrTypePeerAway), and the replica being unreachable, wrap ErrPeerAway.
	Call(ctx context.Context, p PeerPlugin, method string, params, result any) error
}

// Types (kite.ErrorData.Type) of the errors CallLocal answers that are not the plugin's own.
const (
	ErrTypePeerAway = "pluginAway" // not connected to this replica: the call was not made
	ErrTypePeerLost = "pluginLost" // its connection closed during the call: it may have done its work
)

// ErrPeerAway: the replica a plugin's record named does not hold its connection (any more), or
// cannot be reached. The call was not made, or its connection closed during it.
var ErrPeerAway = errors.New("the plugin is not connected to that replica")

// PeerPlugin is a plugin connected to a replica: what it registered with, and where.
type PeerPlugin struct {
	Name        string
	Replica     string // the replica holding the connection (its store InstanceID)
	Session     string // a random id per connection
	Manifest    Manifest
	Version     string
	APIVersion  int
	Where       string // as Status shows it on the replica holding it ("remote 1.2.3.4:5")
	ConnectedAt time.Time
}

func newSession() string { return crand.Text() }

// SetPeers tells the Host the plugins other live replicas hold (kloud's mesh, at each
// heartbeat). A plugin this replica has no connection to gets (or keeps) a proxy in the registry
// and Status shows it as connected on that replica; its calls are forwarded there. A name that is
// a provider built into this kloud is skipped, as its registration here would be refused.
func (h *Host) SetPeers(ps []PeerPlugin) {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen, changed := map[string]bool{}, false
	for _, p := range ps {
		seen[p.Name] = true
		e := h.plugins[p.Name]
		if e != nil && e.conn != nil {
			continue // ours: calls stay here
		}
		if e != nil && e.peer != nil && e.peer.Session == p.Session {
			continue
		}
		if h.taken(e, p.Name, p.Manifest.ResourceType) != nil {
			continue // its registration here would be refused
		}
		m := p.Manifest
		if err := ValidateManifest(&m); err != nil || m.Name != p.Name {
			h.log.Warn("provider plugin on another replica: its manifest is refused here", "provider", p.Name, "replica", p.Replica, "err", err)
			continue
		}
		if e == nil {
			e = &plug{name: p.Name}
			h.plugins[p.Name] = e
		}
		// Not connected here: the proxy follows the registration its calls go to.
		pp := p
		pp.Manifest = m
		e.peer = &pp
		e.manifest, e.version, e.apiVersion = m, p.Version, p.APIVersion
		e.proxy = h.newProxy(p.Name, m)
		e.proxy.Version = p.Version
		h.o.Registry.Replace(e.proxy)
		changed = true
		h.log.Info("provider plugin connected to another replica", "provider", p.Name, "replica", p.Replica, "where", p.Where)
	}
	for _, e := range h.plugins {
		if e.peer != nil && !seen[e.name] {
			e.peer = nil
			if e.conn == nil && e.downSince.IsZero() {
				e.lastErr = "the replica that held its connection no longer does"
				e.downSince = time.Now()
			}
		}
	}
	if changed {
		close(h.changed)
		h.changed = make(chan struct{})
	}
}

// CallLocal makes one call on plugin name's connection here, for another replica (kloud's
// replica.pluginCall), and answers the plugin's result, or its error as it answered it
// (*kite.Error). It does not wait for a plugin that is not connected, or whose connection is not
// session (it registered again since the caller read the record): that is a *kite.Error of type
// ErrTypePeerAway; the connection closing during the call one of ErrTypePeerLost.
func (h *Host) CallLocal(ctx context.Context, name, session, method string, params json.RawMessage) (json.RawMessage, error) {
	h.mu.Lock()
	e := h.plugins[name]
	var c *kite.Conn
	if e != nil && e.conn != nil && (session == "" || e.session == session) {
		c = e.conn
	}
	h.mu.Unlock()
	if c == nil {
		return nil, &kite.Error{Code: kite.CodeState, Message: fmt.Sprintf("provider %s (plugin) is not connected to this replica", name),
			Data: &kite.ErrorData{Type: ErrTypePeerAway}}
	}
	var p any
	if len(params) > 0 && string(params) != "null" {
		p = params
	}
	ctx, cancel := h.withCallTimeout(ctx)
	defer cancel()
	var res json.RawMessage
	err := c.Call(ctx, method, p, &res)
	var ke *kite.Error
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, kite.ErrClosed) || c.Context().Err() != nil:
		return nil, &kite.Error{Code: kite.CodeUnavailable, Message: fmt.Sprintf("provider %s (plugin) disconnected during %s", name, method),
			Data: &kite.ErrorData{Type: ErrTypePeerLost}}
	case errors.As(err, &ke):
		return nil, ke // the plugin's answer, unchanged
	}
	return nil, err
}

// announce records this replica's new connection of e with Peers.
func (h *Host) announce(ctx context.Context, e PeerPlugin) {
	if h.o.Peers == nil {
		return
	}
	if err := h.o.Peers.Connected(ctx, e); err != nil {
		h.log.Warn("provider plugin: record for other replicas", "provider", e.Name, "err", err)
	}
}

// forget removes the record of session (its connection closed), in the background.
func (h *Host) forget(name, session string) {
	if h.o.Peers == nil || session == "" {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.o.Peers.Disconnected(ctx, name, session)
	}()
}
