package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// Provider plugins across replicas (docs/deployment.md "Replicas reach each other"). The replica
// a plugin registered with writes its presence record (store.Plugins: the provider name, the
// replica, the connection's session and the manifest); the others read the records at each
// heartbeat (syncPlugins), give the plugin host the ones held by live replicas (a proxy in their
// registry), and forward each call to the replica named, as replica.pluginCall, which it makes
// over its connection and answers as the plugin did (pluginCall). A dead replica's records go
// with the sweep (bury), a leaving replica's with leave.

// pluginPeers is the plugin host's plugin.Peers: the store's presence records and the links to
// the other replicas.
type pluginPeers struct{ m *mesh }

func (p pluginPeers) Connected(ctx context.Context, pl plugin.PeerPlugin) error {
	man, err := json.Marshal(pl.Manifest)
	if err != nil {
		return fmt.Errorf("plugin %s: manifest: %w", pl.Name, err)
	}
	return p.m.s.store.Plugins().Set(ctx, store.PluginRecord{Name: pl.Name, Replica: p.m.id, Session: pl.Session, Manifest: string(man),
		Version: pl.Version, APIVersion: pl.APIVersion, Where: pl.Where, ConnectedAt: pl.ConnectedAt})
}

func (p pluginPeers) Disconnected(ctx context.Context, name, session string) {
	if _, err := p.m.s.store.Plugins().Remove(ctx, name, session); err != nil {
		p.m.s.log.WarnContext(ctx, "provider plugin disconnected: presence record", "provider", name, "err", err)
	}
}

// Locate reads name's record: a live replica other than this one holds its connection.
func (p pluginPeers) Locate(ctx context.Context, name string) (plugin.PeerPlugin, bool, error) {
	rec, err := p.m.s.store.Plugins().Get(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return plugin.PeerPlugin{}, false, nil
	}
	if err != nil {
		return plugin.PeerPlugin{}, false, err
	}
	if rec.Replica == p.m.id {
		return plugin.PeerPlugin{}, false, nil // ours, from a connection that just closed
	}
	if _, err := p.m.live(ctx, rec.Replica); err != nil {
		return plugin.PeerPlugin{}, false, nil
	}
	pl, err := peerOf(rec)
	return pl, err == nil, err
}

func peerOf(rec store.PluginRecord) (plugin.PeerPlugin, error) {
	pl := plugin.PeerPlugin{Name: rec.Name, Replica: rec.Replica, Session: rec.Session, Version: rec.Version, APIVersion: rec.APIVersion,
		Where: rec.Where, ConnectedAt: rec.ConnectedAt}
	if err := json.Unmarshal([]byte(rec.Manifest), &pl.Manifest); err != nil {
		return pl, fmt.Errorf("plugin %s's presence record: manifest: %w", rec.Name, err)
	}
	return pl, nil
}

// Call sends replica.pluginCall to the replica holding pl's connection and decodes the plugin's
// result into result.
func (p pluginPeers) Call(ctx context.Context, pl plugin.PeerPlugin, method string, params, result any) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return fmt.Errorf("%s: params: %w", method, err)
	}
	r, err := p.m.live(ctx, pl.Replica)
	if err != nil {
		return fmt.Errorf("replica %s, which held its connection: %w: %w", pl.Replica, plugin.ErrPeerAway, err)
	}
	conn, err := p.m.peerConn(ctx, r)
	if err != nil {
		return fmt.Errorf("replica %s, which holds its connection, is unreachable: %w: %w", pl.Replica, plugin.ErrPeerAway, err)
	}
	var res api.ReplicaPluginCallResult
	err = conn.Call(ctx, api.MethodReplicaPluginCall, api.ReplicaPluginCallParams{Provider: pl.Name, Session: pl.Session, Method: method, Params: raw}, &res)
	var ke *kite.Error
	if errors.As(err, &ke) && ke.Type() == plugin.ErrTypePeerAway {
		return fmt.Errorf("%s (replica %s): %w", ke.Message, pl.Replica, plugin.ErrPeerAway)
	}
	if err != nil && (errors.Is(err, kite.ErrClosed) || errors.Is(err, kite.ErrNotSent)) {
		if errors.Is(err, kite.ErrNotSent) {
			return fmt.Errorf("replica %s: %w: %w", pl.Replica, plugin.ErrPeerAway, err)
		}
		// The link closed under the call: the plugin may have done its work.
		return &kite.Error{Code: kite.CodeUnavailable, Message: fmt.Sprintf("the link to replica %s closed: %v", pl.Replica, err),
			Data: &kite.ErrorData{Type: plugin.ErrTypePeerLost}}
	}
	if err != nil {
		return err
	}
	return decodeForwarded(method, res.Result, result)
}

// pluginCall serves replica.pluginCall: replica keys only (routes.go replicaRPC). It calls the
// plugin over its connection here.
func (m *mesh) pluginCall(ctx context.Context, r *kite.Request, p *api.ReplicaPluginCallParams) (api.ReplicaPluginCallResult, error) {
	res, err := m.s.plugins.Plugins().CallLocal(ctx, p.Provider, p.Session, p.Method, p.Params)
	if err != nil {
		return api.ReplicaPluginCallResult{}, err
	}
	return api.ReplicaPluginCallResult{Result: res}, nil
}

// syncPlugins gives the plugin host the plugins other live replicas hold (at each heartbeat).
func (m *mesh) syncPlugins(ctx context.Context) {
	if m.s.plugins == nil {
		return
	}
	var ps []plugin.PeerPlugin
	if !m.alone() {
		recs, err := m.s.store.Plugins().List(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.s.log.WarnContext(ctx, "provider plugins on other replicas", "err", err)
			}
			return
		}
		now := m.s.store.Now()
		m.mu.Lock()
		for _, rec := range recs {
			if r, ok := m.known[rec.Replica]; !ok || rec.Replica == m.id || !r.ExpiresAt.After(now) {
				continue
			}
			if pl, err := peerOf(rec); err == nil {
				ps = append(ps, pl)
			}
		}
		m.mu.Unlock()
	}
	m.s.plugins.Plugins().SetPeers(ps)
}
