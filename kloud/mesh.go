package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kontrol"
)

// Several kloud replicas on one store (docs/deployment.md "Replicas reach each other").
//
// Each replica is a process with an id (the store's InstanceID) and an internal URL
// (Options.InternalURL, kloud serve --internal-url). It keeps a record in the store's replicas
// collection fresh (heartbeat: every Options.ReplicaHeartbeat, expiring after three) and the
// presence records of the agents it holds (store.Kites, KiteRecord.Replica) with it. A call for
// a machine's agent (Server.agentConn) goes over the agent's registration connection when this
// replica holds it, else to the replica its presence record names, over a kite connection
// authenticated with a replica key (kitekey.KindReplicaKey, signed by the shared keyring), as
// replica.agentCall, which makes the call there and answers the agent's result or error
// unchanged. The relay's one-time tickets name the replica waiting for klient's attachment, and
// a replica receiving another's ticket proxies the WebSocket to it (kloud/relay, terminal.go).
// kontrol.query and getToken see every replica's agents through their presence records
// (kontrol.Options.Elsewhere). One sweep at a time (the lease "replica-sweep") removes the
// records of a replica that stopped beating and its agents' presence records, and marks those
// machines' agents disconnected; the agents reconnect through the balancer by themselves.

// Defaults of the replica options.
const (
	// DefaultReplicaHeartbeat is how often a replica renews its record; a record not renewed for
	// ReplicaExpiry heartbeats is dead.
	DefaultReplicaHeartbeat = 5 * time.Second
	// ReplicaExpiry is how many heartbeats a replica's record outlives its last beat.
	ReplicaExpiry = 3
	// replicaKeyTTL is the life of the replica keys this replica dials others with (a new one per
	// connection).
	replicaKeyTTL = time.Hour
	// replicaDialWait bounds the wait for a link to another replica before a forwarded call
	// fails (the replica may have just died: its agents are away until they reconnect).
	replicaDialWait = 5 * time.Second
	// sweepLease names the lease of the dead-replica sweep.
	sweepLease = "replica-sweep"
)

// agentCaller calls a machine's agent: its registration connection here (a *kite.Conn) or a
// forwarder to the replica that holds it (remoteAgent). relay.Agent is the same interface.
type agentCaller interface {
	Call(ctx context.Context, method string, params, result any) error
}

// mesh is this replica's registry entry, its links to the others and the forwarding of agent
// calls.
type mesh struct {
	s   *Server
	id  string
	url string // internal URL
	hb  time.Duration

	done chan struct{} // closed when run returns (it has left)

	mu    sync.Mutex
	peers map[string]*peerLink           // replica id → link
	known map[string]store.ReplicaRecord // the registry as the last beat read it (live saves a store read)
}

type peerLink struct {
	url string
	cl  *kite.Client
}

func newMesh(s *Server) *mesh {
	return &mesh{s: s, id: s.store.InstanceID(), url: strings.TrimRight(s.opts.InternalURL, "/"), hb: s.opts.ReplicaHeartbeat,
		peers: map[string]*peerLink{}, known: map[string]store.ReplicaRecord{}, done: make(chan struct{})}
}

// ID is this replica's id (the store's InstanceID).
func (s *Server) ReplicaID() string { return s.mesh.id }

// ttl is how long a record outlives its last beat.
func (m *mesh) ttl() time.Duration { return ReplicaExpiry * m.hb }

// run beats and sweeps until ctx ends, then leaves (removes its record and presence records).
func (m *mesh) run(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.hb)
	defer t.Stop()
	for {
		m.beat(ctx)
		m.sweep(ctx)
		m.syncPlugins(ctx) // mesh_plugins.go
		select {
		case <-ctx.Done():
			m.leave()
			return
		case <-t.C:
		}
	}
}

func (m *mesh) beat(ctx context.Context) {
	err := m.s.store.Replicas().Beat(ctx, store.ReplicaRecord{ID: m.id, InternalURL: m.url, PublicURL: m.s.opts.PublicURL,
		Version: version.Version}, m.ttl())
	var all []store.ReplicaRecord
	if err == nil {
		all, err = m.s.store.Replicas().List(ctx)
	}
	if err == nil {
		known := make(map[string]store.ReplicaRecord, len(all))
		for _, r := range all {
			known[r.ID] = r
		}
		m.mu.Lock()
		m.known = known
		m.mu.Unlock()
	}
	if err != nil && ctx.Err() == nil {
		m.s.log.WarnContext(ctx, "replica heartbeat", "replica", m.id, "err", err)
	}
}

// sweep removes dead replicas (records past their expiry), one sweeper at a time.
func (m *mesh) sweep(ctx context.Context) {
	now := m.s.store.Now()
	dead, err := m.s.store.Replicas().Expired(ctx, now)
	if err != nil {
		return
	}
	// An earlier process of this replica's instance (kloud restarted on its data directory) is
	// dead however fresh its record: sweep it now, not 3 heartbeats on. Until then its agents'
	// presence records looked live, and a call for an agent that had not registered here again
	// yet was forwarded to that replica's URL, which is this one's (chaos: a snapshot's ping
	// after a kloud SIGKILL failed "agent … is not connected to replica" of its own).
	m.mu.Lock()
	for id, r := range m.known {
		if m.s.store.EarlierProcess(id) && r.ExpiresAt.After(now) {
			dead = append(dead, r)
		}
	}
	m.mu.Unlock()
	if len(dead) == 0 {
		return
	}
	if _, err := m.s.store.AcquireLease(ctx, sweepLease, m.id, m.ttl()); err != nil {
		return // another replica sweeps (or the store is away: next beat)
	}
	defer m.s.store.ReleaseLease(context.WithoutCancel(ctx), sweepLease, m.id)
	for _, r := range dead {
		if r.ID == m.id {
			continue // our own record lapsed (a store outage): the next beat renews it
		}
		m.bury(ctx, r.ID, now)
	}
}

// bury removes a dead replica's presence records, marks its agents disconnected and removes its
// record; the record goes last, so a sweep cut short is done again by the next. The disconnect
// is written as the dead replica: an agent whose machine record already names a live replica
// (it registered again there, and its presence record was not yet rewritten) stays connected.
// (Written as the sweeper, it was not: ci49's TestBackupRestore, where the restored kloud swept
// the backed-up kloud's record while the agents came back, left one agent "disconnected".)
func (m *mesh) bury(ctx context.Context, id string, now time.Time) {
	gone, err := m.s.store.Kites().RemoveReplica(ctx, id)
	for _, k := range gone {
		m.s.setAgentAs(ctx, k, model.AgentDisconnected, "", id)
	}
	if err == nil {
		_, err = m.s.store.Plugins().RemoveReplica(ctx, id)
	}
	switch {
	case err != nil:
	case m.s.store.EarlierProcess(id): // dead for sure (it held this data directory's lock)
		err = m.s.store.Replicas().Leave(ctx, id)
	default:
		_, err = m.s.store.Replicas().Remove(ctx, id, now)
	}
	m.drop(id)
	if err != nil {
		m.s.log.WarnContext(ctx, "sweep dead replica", "replica", id, "err", err)
		return
	}
	m.s.log.InfoContext(ctx, "dead replica swept", "replica", id, "agents", len(gone))
}

// leave removes this replica's record and the presence records it still holds (a clean
// shutdown; a killed replica's are swept by the others).
func (m *mesh) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := m.s.store.Kites().RemoveReplica(ctx, m.id); err != nil {
		m.s.log.Warn("replica leave: presence records", "err", err)
	}
	if _, err := m.s.store.Plugins().RemoveReplica(ctx, m.id); err != nil {
		m.s.log.Warn("replica leave: plugin presence records", "err", err)
	}
	if err := m.s.store.Replicas().Leave(ctx, m.id); err != nil {
		m.s.log.Warn("replica leave", "err", err)
	}
	m.mu.Lock()
	for id, p := range m.peers {
		p.cl.Close()
		delete(m.peers, id)
	}
	m.mu.Unlock()
}

func (m *mesh) drop(id string) {
	m.mu.Lock()
	p := m.peers[id]
	delete(m.peers, id)
	m.mu.Unlock()
	if p != nil {
		p.cl.Close()
	}
}

// beating returns the record of replica id and whether it is not past its expiry: as the last
// beat read it, else (a replica started since, or one whose record the beat saw expiring) from
// the store.
func (m *mesh) beating(ctx context.Context, id string) (store.ReplicaRecord, bool, error) {
	if m.s.store.EarlierProcess(id) {
		return store.ReplicaRecord{ID: id}, false, nil // this replica before a restart: dead
	}
	m.mu.Lock()
	r, ok := m.known[id]
	m.mu.Unlock()
	if !ok || !r.ExpiresAt.After(m.s.store.Now()) {
		var err error
		if r, err = m.s.store.Replicas().Get(ctx, id); err != nil {
			return r, false, err
		}
	}
	return r, r.ExpiresAt.After(m.s.store.Now()), nil
}

// live returns the record of replica id if it is alive (beating) and reachable (has an internal
// URL).
func (m *mesh) live(ctx context.Context, id string) (store.ReplicaRecord, error) {
	r, ok, err := m.beating(ctx, id)
	if err != nil {
		return r, err
	}
	if !ok {
		return r, fmt.Errorf("replica %s stopped beating at %s: %w", id, r.LastSeen.Format(time.RFC3339), store.ErrNotFound)
	}
	if r.InternalURL == "" {
		return r, fmt.Errorf("replica %s has no internal URL: %w", id, store.ErrNotFound)
	}
	return r, nil
}

// alone says whether the registry, as the last beat read it, lists no other live replica: the
// planner's wait then looks for its agent here only (a replica started since is seen at the next
// beat), rather than reading the store four times a second for each agent it waits for.
func (m *mesh) alone() bool {
	now := m.s.store.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.known {
		if id != m.id && r.ExpiresAt.After(now) && !m.s.store.EarlierProcess(id) {
			return false
		}
	}
	return true
}

// PeerURL is the internal URL of live replica id (the relay proxies attachments to it).
func (m *mesh) PeerURL(ctx context.Context, id string) (string, error) {
	r, err := m.live(ctx, id)
	if err != nil {
		return "", err
	}
	return r.InternalURL, nil
}

// link returns the kite link to replica r, dialing it if needed.
func (m *mesh) link(r store.ReplicaRecord) *kite.Client {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.peers[r.ID]; p != nil && p.url == r.InternalURL {
		return p.cl
	} else if p != nil {
		p.cl.Close()
	}
	cl := m.s.Kite.NewClient(kite.ClientOptions{
		URL: r.InternalURL + "/kite",
		Auth: func(context.Context) (kite.Auth, error) {
			key, err := m.s.Signer().ReplicaKey(m.id, replicaKeyTTL)
			return kite.Auth{Type: kitekey.KindReplicaKey, Key: key}, err
		},
		MaxBackoff: 2 * time.Second,
	})
	cl.Start()
	m.peers[r.ID] = &peerLink{url: r.InternalURL, cl: cl}
	return cl
}

// agentConn returns a caller of m's agent: its connection here, or a forwarder to the live
// replica that holds it; kite.ErrState when no replica does.
func (s *Server) agentConn(ctx context.Context, m *model.Machine) (agentCaller, error) {
	if m.KiteID == "" {
		return nil, fmt.Errorf("machine %s has no agent yet: %w", m.Label, kite.ErrState)
	}
	if c := s.Kontrol.Conn(m.KiteID); c != nil {
		return c, nil
	}
	rec, err := s.store.Kites().Get(ctx, m.KiteID)
	if err == nil && rec.Replica != s.mesh.id {
		if r, err := s.mesh.live(ctx, rec.Replica); err == nil {
			return &remoteAgent{m: s.mesh, replica: r, kiteID: m.KiteID}, nil
		}
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("the agent of machine %s: %w", m.Label, err)
	}
	return nil, fmt.Errorf("the agent of machine %s is not connected: %w", m.Label, kite.ErrState)
}

// remoteAgent forwards calls for an agent to the replica holding its connection.
type remoteAgent struct {
	m       *mesh
	replica store.ReplicaRecord
	kiteID  string
}

// Call sends replica.agentCall and decodes the agent's result into result. The agent's own
// errors come back as it answered them (code, message, data); the other replica not reaching
// the agent (api.ErrTypeAgentAway), and the link to it failing, are kite.ErrState or
// kite.ErrClosed here, as for an agent of this replica that went away.
func (a *remoteAgent) Call(ctx context.Context, method string, params, result any) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return fmt.Errorf("%s: params: %w", method, err)
	}
	conn, err := a.m.peerConn(ctx, a.replica)
	if err != nil {
		return fmt.Errorf("%s: replica %s, which holds the agent's connection, is unreachable: %w: %w", method, a.replica.ID, kite.ErrState, err)
	}
	var res api.ReplicaAgentCallResult
	err = conn.Call(ctx, api.MethodReplicaAgentCall, api.ReplicaAgentCallParams{KiteID: a.kiteID, Method: method, Params: raw}, &res)
	var ke *kite.Error
	if errors.As(err, &ke) && ke.Type() == api.ErrTypeAgentAway {
		return fmt.Errorf("%s (via replica %s): %w", ke.Message, a.replica.ID, kite.ErrState)
	}
	if err != nil {
		return err
	}
	return decodeForwarded(method, res.Result, result)
}

// peerConn returns the kite connection to replica r, dialing it if needed (waiting at most
// replicaDialWait: the replica may have just died).
func (m *mesh) peerConn(ctx context.Context, r store.ReplicaRecord) (*kite.Conn, error) {
	wctx, cancel := context.WithTimeout(ctx, replicaDialWait)
	defer cancel()
	return m.link(r).Conn(wctx)
}

// decodeForwarded decodes the result another replica forwarded (raw, as the agent or plugin
// answered it) into result.
func decodeForwarded(method string, raw json.RawMessage, result any) error {
	if result == nil || len(raw) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, result); err != nil {
		return fmt.Errorf("%s: result: %w", method, err)
	}
	return nil
}

// agentCall serves replica.agentCall: replica keys only (routes.go replicaRPC). It calls the
// agent over its connection here.
func (m *mesh) agentCall(ctx context.Context, r *kite.Request, p *api.ReplicaAgentCallParams) (api.ReplicaAgentCallResult, error) {
	c := m.s.Kontrol.Conn(p.KiteID)
	if c == nil {
		return api.ReplicaAgentCallResult{}, agentAway(fmt.Sprintf("agent %s is not connected to replica %s", p.KiteID, m.id))
	}
	var params any
	if len(p.Params) > 0 && string(p.Params) != "null" {
		params = p.Params
	}
	var res json.RawMessage
	err := c.Call(ctx, p.Method, params, &res)
	var ke *kite.Error
	if err != nil && (errors.Is(err, kite.ErrClosed) || errors.Is(err, kite.ErrNotSent) || !errors.As(err, &ke) || ke == kite.ErrState) {
		// Not the agent's answer: its connection went away under the call.
		return api.ReplicaAgentCallResult{}, agentAway(err.Error())
	}
	if err != nil {
		return api.ReplicaAgentCallResult{}, ke // the agent's answer, unchanged
	}
	return api.ReplicaAgentCallResult{Result: res}, nil
}

func agentAway(msg string) error {
	return &kite.Error{Code: kite.CodeState, Message: msg, Data: &kite.ErrorData{Type: api.ErrTypeAgentAway}}
}

// elsewhere answers kontrol.query and getToken with the agents other live replicas hold (their
// presence records), for kontrol.Options.Elsewhere.
func (m *mesh) elsewhere(ctx context.Context, q kite.Identity) ([]kontrol.KiteInfo, error) {
	f := map[string]string{"id": q.ID, "username": q.Username, "environment": q.Environment, "name": q.Name,
		"version": q.Version, "region": q.Region, "hostname": q.Hostname}
	recs, err := m.s.store.Kites().Find(ctx, f)
	if err != nil {
		return nil, err
	}
	// A record is as fresh as its replica: one that stopped beating holds no connection, and its
	// records go with the sweep. (Refreshing every record's lastSeen at every beat cost the store
	// one write per agent per heartbeat: 10,000 agents kept a store server busy.)
	alive := map[string]bool{}
	var out []kontrol.KiteInfo
	for _, r := range recs {
		if r.Replica == m.id {
			continue
		}
		ok, seen := alive[r.Replica]
		if !seen {
			_, ok, _ = m.beating(ctx, r.Replica) // an unreadable record: not shown, as a dead one
			alive[r.Replica] = ok
		}
		if !ok {
			continue
		}
		out = append(out, kontrol.KiteInfo{Kite: kite.Identity{ID: r.ID, Username: r.Username, Environment: r.Environment,
			Name: r.Name, Version: r.Version, Region: r.Region, Hostname: r.Hostname}, URL: r.URL, RegisteredAt: r.ConnectedAt})
	}
	return out, nil
}
