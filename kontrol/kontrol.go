// Package kontrol is the registry of kites: who is connected, how to find them, and the keys and
// tokens that let one kite talk to another (docs/protocol.md §kontrol).
//
// Start with New: kontrol adds its methods (kontrol.register, query, getToken, getKey and the
// admin methods) to a kite.Kite, normally kloud's. A kite is present exactly while its
// registration connection is up: kontrol drops it the moment the connection closes, and the
// kite's WebSocket pings (Options.PingInterval/PingTimeout of that kite) catch half-open links.
// Kites re-register themselves after a kontrol restart (kite.Client re-runs its hooks).
//
// Who may call what is kontrol's method table (methods in kontrol.go): a machine agent — a kite
// that authenticated with its machine's agent key (kitekey.KindAgentKey, or a kite key minted for
// an agent before agent keys had their own kind) — may only call the methods marked Agent there
// (kontrol.register, of its own kite id under its owner's name, and kontrol.getKey); every other
// method refuses it with -32002 before looking at its params, and a new method refuses agents
// unless someone marks it. So the key on a machine, readable by whoever is root there, never
// gets tokens, keys or anything else of its owner.
package kontrol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// Options configures kontrol. Zero fields take the documented defaults.
type Options struct {
	Kite    *kite.Kite       // required: kontrol's methods are added to it
	Keyring *kitekey.Keyring // required: signing keys (current signs, every unretired key verifies)
	// Issuer is the iss claim of everything kontrol signs (default "kontrol").
	Issuer string
	// URL is kontrol's kite URL, written into the kite keys it mints (required for createKey).
	URL string
	// Revocations records revoked credential ids (required).
	Revocations Revocations
	// IsAdmin reports whether a user administers this kontrol (default: username "admin").
	IsAdmin func(username string) bool
	// Authorize decides whether caller may see and get tokens for target (kontrol.query,
	// kontrol.getToken). Default: the kite's owner and admins.
	Authorize func(ctx context.Context, caller *kite.Principal, target kite.Identity) error
	// TokenTTL is the lifetime of tokens from getToken (default 30m, at most 1h).
	TokenTTL time.Duration
	// Presence, if set, mirrors registrations into shared storage (ARCHITECTURE §9).
	Presence Presence
	// Elsewhere, if set, returns the kites matching q that other replicas hold (from the
	// presence records in shared storage): kontrol.query and getToken answer with them too,
	// after the same Authorize. Kites registered here win over a record of the same id.
	Elsewhere func(ctx context.Context, q kite.Identity) ([]KiteInfo, error)
	Logger    *slog.Logger
	// OnEvent, if set, is told of every registration and deregistration of this process's
	// kites, after its watchers (kloud writes them to the replicas' change log, and the other
	// replicas hand them to [Kontrol.PublishRemote]). It must not block.
	OnEvent func(Event)
	// Wrap, if set, wraps each of kontrol's handlers as it is registered, with the method's
	// name (kloud records the calls that change keys and revocations in its audit log).
	Wrap func(method string, h kite.Handler) kite.Handler
}

// Revocations stores revoked credential ids (jti). It is a kitekey.Revoker.
type Revocations interface {
	kitekey.Revoker
	Revoke(ctx context.Context, jti, reason string) error
}

// Presence mirrors the registry into shared storage so other replicas and operators can see it.
// Kontrol calls it best-effort: the live connection stays the truth.
type Presence interface {
	Upsert(ctx context.Context, r KiteInfo) error
	Remove(ctx context.Context, id string) error
}

// The wire types of kontrol's methods are package kontrolapi's; these names keep kontrol's Go
// API (Presence, Lookup, Subscribe) reading as before.
type (
	KiteInfo        = kontrolapi.KiteInfo
	Event           = kontrolapi.Event
	RegisterParams  = kontrolapi.RegisterParams
	RegisterResult  = kontrolapi.RegisterResult
	QueryParams     = kontrolapi.QueryParams
	QueryResult     = kontrolapi.QueryResult
	GetTokenParams  = kontrolapi.GetTokenParams
	GetTokenResult  = kontrolapi.GetTokenResult
	KeysResult      = kontrolapi.KeysResult
	CreateKeyParams = kontrolapi.CreateKeyParams
	CreateKeyResult = kontrolapi.CreateKeyResult
	RetireKeyParams = kontrolapi.RetireKeyParams
	RevokeParams    = kontrolapi.RevokeParams
)

// Kontrol is the registry.
type Kontrol struct {
	opts   Options
	log    *slog.Logger
	signer *kitekey.Signer

	mu       sync.RWMutex
	byID     map[string]*entry
	watchers map[*watcher]struct{}
}

type entry struct {
	info KiteInfo
	conn *kite.Conn
}

type watcher struct {
	caller *kite.Principal // nil: an in-process subscriber that sees everything
	query  kite.Identity
	stream *kite.Stream // nil for in-process subscribers
	queue  chan Event
}

// New adds kontrol's methods to opts.Kite.
func New(opts Options) (*Kontrol, error) {
	if opts.Kite == nil || opts.Keyring == nil || opts.Revocations == nil {
		return nil, errors.New("kontrol: Kite, Keyring and Revocations are required")
	}
	if opts.Issuer == "" {
		opts.Issuer = "kontrol"
	}
	if opts.IsAdmin == nil {
		opts.IsAdmin = func(u string) bool { return u == "admin" }
	}
	if opts.TokenTTL <= 0 {
		opts.TokenTTL = 30 * time.Minute
	}
	if opts.TokenTTL > kitekey.MaxTokenTTL {
		return nil, fmt.Errorf("kontrol: TokenTTL %s is over %s", opts.TokenTTL, kitekey.MaxTokenTTL)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	k := &Kontrol{
		opts:     opts,
		log:      opts.Logger.With("component", "kontrol"),
		signer:   &kitekey.Signer{Current: opts.Keyring.Current, Issuer: opts.Issuer},
		byID:     map[string]*entry{},
		watchers: map[*watcher]struct{}{},
	}
	if opts.Authorize == nil {
		k.opts.Authorize = k.ownerOrAdmin
	}
	for _, m := range k.methods() {
		h := m.h
		if opts.Wrap != nil {
			h = opts.Wrap(m.Name, h)
		}
		opts.Kite.Handle(m.Name, kitekey.AgentGate(h, m.Agent))
	}
	return k, nil
}

// Method is a row of kontrol's method table.
type Method struct {
	Name string
	// Agent marks the methods a machine agent (an agent key) may call: registering itself and
	// fetching kontrol's public keys to verify the tokens presented to it. Every other method
	// refuses agents with -32002 (kitekey.AgentGate).
	Agent bool
	h     kite.Handler
}

// methods is kontrol's method table: every method it adds to its kite, and who may call it.
func (k *Kontrol) methods() []Method {
	return []Method{
		{Name: kontrolapi.MethodRegister, Agent: true, h: kite.Typed(k.register)},
		{Name: kontrolapi.MethodGetKey, Agent: true, h: kite.HandlerFunc(k.getKey)},
		{Name: kontrolapi.MethodQuery, h: kite.Typed(k.query)},
		{Name: kontrolapi.MethodGetToken, h: kite.Typed(k.getToken)},
		{Name: kontrolapi.MethodCreateKey, h: kite.Typed(k.createKey)},
		{Name: kontrolapi.MethodRotateKey, h: kite.HandlerFunc(k.rotateKey)},
		{Name: kontrolapi.MethodRetireKey, h: kite.Typed(k.retireKey)},
		{Name: kontrolapi.MethodRevoke, h: kite.Typed(k.revoke)},
	}
}

// Methods returns kontrol's method table (name and whether agents may call it), as registered.
func (k *Kontrol) Methods() []Method { return k.methods() }

// Signer returns kontrol's signer (kloud mints machine kite keys and sessions with it).
func (k *Kontrol) Signer() *kitekey.Signer { return k.signer }

// Verifier returns a verifier for credentials kontrol signed.
func (k *Kontrol) Verifier() *kitekey.Verifier {
	return &kitekey.Verifier{Keys: k.opts.Keyring, Issuer: k.opts.Issuer, Revoked: k.opts.Revocations}
}

func (k *Kontrol) isAdmin(p *kite.Principal) bool {
	return p != nil && !kitekey.IsRestricted(p) && (p.Admin || k.opts.IsAdmin(p.Username))
}

func (k *Kontrol) ownerOrAdmin(_ context.Context, caller *kite.Principal, target kite.Identity) error {
	if caller != nil && !kitekey.IsRestricted(caller) && (caller.Username == target.Username || k.isAdmin(caller)) {
		return nil
	}
	return fmt.Errorf("kite %s belongs to another user: %w", target.ID, kite.ErrPermission)
}

func (k *Kontrol) register(ctx context.Context, r *kite.Request, p *RegisterParams) (any, error) {
	pr := r.Principal()
	if pr == nil || (pr.Type != kite.AuthKiteKey && !kitekey.IsAgent(pr)) {
		return nil, fmt.Errorf("kontrol.register needs a kite key or an agent key: %w", kite.ErrPermission)
	}
	id := r.Peer()
	if err := id.Validate(true); err != nil {
		return nil, fmt.Errorf("kontrol.register: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	// A key registers exactly its own kite: the id is the key's jti and the username the one it
	// proved (for an agent key: the owner in its claims). The handshake already set both from
	// the key; this keeps it true whatever the kite package does.
	if id.ID != pr.KiteID || id.Username != pr.Username {
		return nil, fmt.Errorf("kontrol.register: a key registers only its own kite (%s of %s), not %s: %w",
			pr.KiteID, pr.Username, id.String(), kite.ErrPermission)
	}
	if kitekey.IsAgent(pr) && slices.Contains(kontrolapi.HostNames, id.Name) {
		return nil, fmt.Errorf("kontrol.register: %q is the name of a user's host kite; a machine's agent key cannot register as one: %w",
			id.Name, kite.ErrPermission)
	}
	if len(p.URL) > 2048 {
		return nil, fmt.Errorf("kontrol.register: url too long: %w", kite.ErrInvalidParams)
	}
	info := KiteInfo{Kite: id, URL: p.URL, RegisteredAt: time.Now().UTC(), Remote: ""}
	e := &entry{info: info, conn: r.Conn}
	k.mu.Lock()
	old := k.byID[id.ID]
	k.byID[id.ID] = e
	k.mu.Unlock()
	if old != nil && old.conn != r.Conn {
		// The same kite came back on a new connection before the old one was noticed dead:
		// the newer registration wins.
		old.conn.Close(fmt.Errorf("kite %s registered again on another connection", id.ID))
	}
	r.Conn.OnClose(func() { k.deregister(e) })
	if old == nil || old.conn != r.Conn {
		k.publish("register", info)
	}
	if k.opts.Presence != nil {
		if err := k.opts.Presence.Upsert(ctx, info); err != nil {
			k.log.Warn("presence upsert", "kite", id.ID, "err", err)
		}
	}
	k.log.Info("kite registered", "kite", id.String())
	return RegisterResult{Kite: info, Keys: k.opts.Keyring.Public()}, nil
}

func (k *Kontrol) deregister(e *entry) {
	k.mu.Lock()
	cur := k.byID[e.info.Kite.ID]
	if cur != e {
		k.mu.Unlock()
		return
	}
	delete(k.byID, e.info.Kite.ID)
	k.mu.Unlock()
	k.publish("deregister", e.info)
	if k.opts.Presence != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := k.opts.Presence.Remove(ctx, e.info.Kite.ID); err != nil {
			k.log.Warn("presence remove", "kite", e.info.Kite.ID, "err", err)
		}
	}
	k.log.Info("kite gone", "kite", e.info.Kite.String(), "reason", e.conn.Err())
}

// Lookup returns the registered kites matching q, sorted by id, and a connection to each
// (kloud calls agents through their registration connection).
func (k *Kontrol) Lookup(q kite.Identity) []KiteInfo {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.lookupLocked(q)
}

func (k *Kontrol) lookupLocked(q kite.Identity) []KiteInfo {
	var out []KiteInfo
	if q.ID != "" {
		if e := k.byID[q.ID]; e != nil && e.info.Kite.Matches(q) {
			out = append(out, e.info)
		}
		return out
	}
	for _, e := range k.byID {
		if e.info.Kite.Matches(q) {
			out = append(out, e.info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kite.ID < out[j].Kite.ID })
	return out
}

// Conn returns the registration connection of the kite with id, or nil.
func (k *Kontrol) Conn(id string) *kite.Conn {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if e := k.byID[id]; e != nil {
		return e.conn
	}
	return nil
}

func (k *Kontrol) visible(ctx context.Context, caller *kite.Principal, in []KiteInfo) []KiteInfo {
	out := in[:0:0]
	for _, i := range in {
		if k.opts.Authorize(ctx, caller, i.Kite) == nil {
			out = append(out, i)
		}
	}
	return out
}

func (k *Kontrol) query(ctx context.Context, r *kite.Request, p *QueryParams) (any, error) {
	caller := r.Principal()
	if !p.Watch {
		found, err := k.lookupAll(ctx, p.Query)
		if err != nil {
			return nil, err
		}
		return QueryResult{Kites: k.visible(ctx, caller, found)}, nil
	}
	w := &watcher{caller: caller, query: p.Query, stream: r.Conn.NewStream(kontrolapi.MethodEvent), queue: make(chan Event, 1024)}
	k.mu.Lock()
	found := k.lookupLocked(p.Query)
	k.watchers[w] = struct{}{}
	k.mu.Unlock()
	go k.pump(w)
	return QueryResult{Kites: k.visible(ctx, caller, found), Subscription: w.stream.ID()}, nil
}

// pump sends a watcher's events in order; a watcher too slow to keep 1024 events queued loses
// its stream (it ends with an error and can query again).
func (k *Kontrol) pump(w *watcher) {
	defer func() {
		k.mu.Lock()
		delete(k.watchers, w)
		k.mu.Unlock()
	}()
	for {
		select {
		case ev, ok := <-w.queue:
			if !ok {
				w.stream.End(context.Background(), fmt.Errorf("watch fell behind: %w", kite.ErrTooLarge))
				return
			}
			ctx, cancel := context.WithTimeout(w.stream.Context(), 10*time.Second)
			err := w.stream.Send(ctx, ev)
			cancel()
			if err != nil {
				return
			}
		case <-w.stream.Done():
			return
		}
	}
}

func (k *Kontrol) publish(action string, info KiteInfo) {
	k.mu.Lock()
	k.publishLocked(Event{Action: action, Kite: info}, false)
	k.mu.Unlock()
	if k.opts.OnEvent != nil {
		k.opts.OnEvent(Event{Action: action, Kite: info})
	}
}

// publishLocked queues ev for the watchers whose query and authorization take it (only the
// kontrol.watch streams when remote). k.mu is held.
func (k *Kontrol) publishLocked(ev Event, remote bool) {
	for w := range k.watchers {
		if remote && w.stream == nil {
			continue
		}
		if !ev.Kite.Kite.Matches(w.query) || (w.caller != nil && k.opts.Authorize(context.Background(), w.caller, ev.Kite.Kite) != nil) {
			continue
		}
		select {
		case w.queue <- ev:
		default:
			close(w.queue)
			delete(k.watchers, w)
		}
	}
}

// PublishRemote hands ev, a registration or deregistration of a kite connected to another
// replica (kloud's change log, ARCHITECTURE §9), to this kontrol's kontrol.watch streams, with
// the same filters as its own. In-process subscribers ([Kontrol.Subscribe]) do not get it: they
// act on this process's connections (kloud's planner, its agent status). A deregister of a kite
// registered here now is dropped: the kite moved here, and its watchers saw it register.
func (k *Kontrol) PublishRemote(ev Event) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if ev.Action == "deregister" && k.byID[ev.Kite.Kite.ID] != nil {
		return
	}
	k.publishLocked(ev, true)
}

// Subscribe delivers, in process, an Event whenever a kite matching q registers or goes away,
// and returns the kites registered now (subscribe first, then look, so nothing falls between).
// The channel is closed by cancel, or if the subscriber falls 1024 events behind (subscribe
// again). This is how kloud's planner waits for agents: push, no polling.
func (k *Kontrol) Subscribe(q kite.Identity) (events <-chan Event, now []KiteInfo, cancel func()) {
	w := &watcher{query: q, queue: make(chan Event, 1024)}
	k.mu.Lock()
	k.watchers[w] = struct{}{}
	now = k.lookupLocked(q)
	k.mu.Unlock()
	var once sync.Once
	return w.queue, now, func() {
		once.Do(func() {
			k.mu.Lock()
			defer k.mu.Unlock()
			if _, ok := k.watchers[w]; ok {
				delete(k.watchers, w)
				close(w.queue)
			}
		})
	}
}

// lookupAll is Lookup plus the kites other replicas hold (Options.Elsewhere), sorted by id.
func (k *Kontrol) lookupAll(ctx context.Context, q kite.Identity) ([]KiteInfo, error) {
	found := k.Lookup(q)
	if k.opts.Elsewhere == nil {
		return found, nil
	}
	more, err := k.opts.Elsewhere(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("kites of other replicas: %w: %w", kite.ErrUnavailable, err)
	}
	here := make(map[string]bool, len(found))
	for _, i := range found {
		here[i.Kite.ID] = true
	}
	for _, i := range more {
		if !here[i.Kite.ID] && i.Kite.Matches(q) {
			found = append(found, i)
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Kite.ID < found[j].Kite.ID })
	return found, nil
}

func (k *Kontrol) getToken(ctx context.Context, r *kite.Request, p *GetTokenParams) (any, error) {
	caller := r.Principal()
	all, err := k.lookupAll(ctx, p.Query)
	if err != nil {
		return nil, err
	}
	found := k.visible(ctx, caller, all)
	switch {
	case len(found) == 0:
		return nil, fmt.Errorf("no registered kite you may use matches %s: %w", p.Query.String(), kite.ErrNotFound)
	case len(found) > 1:
		return nil, fmt.Errorf("query %s matches %d kites; a token is for exactly one: %w", p.Query.String(), len(found), kite.ErrConflict)
	}
	tok, err := k.signer.Token(caller.Username, found[0].Kite.ID, k.opts.TokenTTL)
	if err != nil {
		return nil, fmt.Errorf("kontrol.getToken: %w", err)
	}
	return GetTokenResult{Token: tok, Kite: found[0], ExpiresAt: time.Now().Add(k.opts.TokenTTL).UTC()}, nil
}

// Token mints a token for caller to use the kite with id, after the same permission check
// getToken makes. Kloud uses it to reach agents on behalf of users.
func (k *Kontrol) Token(ctx context.Context, caller *kite.Principal, id string) (string, error) {
	all, err := k.lookupAll(ctx, kite.Identity{ID: id})
	if err != nil {
		return "", err
	}
	found := k.visible(ctx, caller, all)
	if len(found) != 1 {
		return "", fmt.Errorf("kite %s: %w", id, kite.ErrNotFound)
	}
	return k.signer.Token(caller.Username, id, k.opts.TokenTTL)
}

// PublicKeys returns kontrol's public keys (also served without auth at /kite/keys).
func (k *Kontrol) PublicKeys() KeysResult {
	return KeysResult{Current: k.opts.Keyring.Current().ID, Keys: k.opts.Keyring.Public()}
}

func (k *Kontrol) getKey(context.Context, *kite.Request) (any, error) { return k.PublicKeys(), nil }

func (k *Kontrol) requireAdmin(r *kite.Request) error {
	if !k.isAdmin(r.Principal()) {
		return fmt.Errorf("%s is for administrators: %w", r.Method, kite.ErrPermission)
	}
	return nil
}

func (k *Kontrol) createKey(ctx context.Context, r *kite.Request, p *CreateKeyParams) (any, error) {
	if err := k.requireAdmin(r); err != nil {
		return nil, err
	}
	if strings.HasPrefix(p.KiteID, kitekey.AgentIDPrefix) {
		return nil, fmt.Errorf("kite id %q: ids starting with %q are machine agents'; their keys are minted by kloud when it builds the machine: %w",
			p.KiteID, kitekey.AgentIDPrefix, kite.ErrInvalidParams)
	}
	key, id, err := k.CreateKey(p.Username, p.KiteID)
	if err != nil {
		return nil, err
	}
	return CreateKeyResult{Key: key, KiteID: id}, nil
}

// CreateKey mints a kite key for username with kite id (a new random one if empty).
func (k *Kontrol) CreateKey(username, id string) (key, kiteID string, err error) {
	return k.CreateKeyWithURL(username, id, k.opts.URL)
}

// CreateKeyWithURL is CreateKey with the kontrol URL the kite should use (machines may reach
// kontrol at another address than users do).
func (k *Kontrol) CreateKeyWithURL(username, id, url string) (key, kiteID string, err error) {
	if url == "" {
		return "", "", errors.New("kontrol: no URL configured to put into kite keys")
	}
	if id == "" {
		id = newID()
	}
	key, err = k.signer.KiteKey(username, id, url)
	if err != nil {
		return "", "", fmt.Errorf("create kite key: %w", err)
	}
	return key, id, nil
}

// CreateAgentKey mints the key of a machine's agent (kind agentKey, sub "machine:<id>"), which
// may register that one kite under the owner's name and call nothing else. a.KiteID defaults to
// a new id with kitekey.AgentIDPrefix; a.KontrolURL to Options.URL.
func (k *Kontrol) CreateAgentKey(a kitekey.AgentKeySpec) (key, kiteID string, err error) {
	if a.KiteID == "" {
		a.KiteID = kitekey.AgentIDPrefix + newID()
	}
	if a.KontrolURL == "" {
		a.KontrolURL = k.opts.URL
	}
	key, err = k.signer.AgentKey(a)
	if err != nil {
		return "", "", fmt.Errorf("create agent key: %w", err)
	}
	return key, a.KiteID, nil
}

// CreatePluginKey mints the key of an out-of-process provider (kind pluginKey, sub
// "provider:<name>"), which authenticates only where plugin keys are accepted (kloud) and only
// for the plugin-facing methods. The jti defaults to kitekey.PluginIDPrefix + a random id; a zero
// TTL makes a key that does not expire (revocable by jti, like a kite key).
func (k *Kontrol) CreatePluginKey(p kitekey.PluginKeySpec) (key, kiteID string, err error) {
	if p.KiteID == "" {
		p.KiteID = kitekey.PluginIDPrefix + newID()
	}
	key, err = k.signer.PluginKey(p)
	if err != nil {
		return "", "", fmt.Errorf("create plugin key: %w", err)
	}
	return key, p.KiteID, nil
}

func (k *Kontrol) rotateKey(ctx context.Context, r *kite.Request) (any, error) {
	if err := k.requireAdmin(r); err != nil {
		return nil, err
	}
	kp, err := k.opts.Keyring.Rotate(ctx)
	if err != nil {
		return nil, fmt.Errorf("rotate key: %w", err)
	}
	k.log.Info("signing key rotated", "kid", kp.ID)
	return k.PublicKeys(), nil
}

func (k *Kontrol) retireKey(ctx context.Context, r *kite.Request, p *RetireKeyParams) (any, error) {
	if err := k.requireAdmin(r); err != nil {
		return nil, err
	}
	if err := k.opts.Keyring.Retire(ctx, p.KID); err != nil {
		return nil, fmt.Errorf("retire key %q: %w", p.KID, err)
	}
	k.log.Info("signing key retired", "kid", p.KID)
	return k.PublicKeys(), nil
}

func (k *Kontrol) revoke(ctx context.Context, r *kite.Request, p *RevokeParams) (any, error) {
	if err := k.requireAdmin(r); err != nil {
		return nil, err
	}
	if err := k.Revoke(ctx, p.JTI, p.Reason); err != nil {
		return nil, err
	}
	return map[string]bool{"revoked": true}, nil
}

// Revoke revokes the credential with id jti; a kite registered with that kite key is
// disconnected at once, and every connection that authenticated with it is closed.
func (k *Kontrol) Revoke(ctx context.Context, jti, reason string) error {
	if err := k.opts.Revocations.Revoke(ctx, jti, reason); err != nil {
		return fmt.Errorf("revoke %s: %w", jti, err)
	}
	for _, c := range k.opts.Kite.Conns() {
		if p := c.Principal(); p != nil && p.TokenID == jti {
			c.Close(fmt.Errorf("credential %s revoked", jti))
		}
	}
	k.log.Info("credential revoked", "jti", jti, "reason", reason)
	return nil
}
