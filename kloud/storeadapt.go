package kloud

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kontrol"
)

// storeKeys keeps kontrol's signing keys in the store (kitekey.KeyStore).
type storeKeys struct{ k *store.Keys }

func (s storeKeys) LoadKeys(ctx context.Context) ([]*kitekey.KeyPair, error) {
	recs, err := s.k.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*kitekey.KeyPair, 0, len(recs))
	for _, r := range recs {
		out = append(out, &kitekey.KeyPair{ID: r.ID, Private: r.Private, Public: r.Public, CreatedAt: r.CreatedAt, RetiredAt: r.RetiredAt})
	}
	return out, nil
}

func (s storeKeys) AddKey(ctx context.Context, k *kitekey.KeyPair) error {
	return wireError(s.k.Add(ctx, store.KeyRecord{ID: k.ID, Alg: "EdDSA", Public: k.Public, Private: k.Private, CreatedAt: k.CreatedAt, RetiredAt: k.RetiredAt}))
}

func (s storeKeys) RetireKey(ctx context.Context, kid string, at time.Time) error {
	return wireError(s.k.Retire(ctx, kid, at))
}

// storeRevocations keeps revoked credential ids in the store, and a copy in memory: every
// handshake asks, and the store (one connection when embedded) must not be in that path. The
// copy is reloaded by a handshake when it is older than revocationsTTL, and every revocationsTTL
// by run (a background task), so a revocation made by another replica is refused here within
// revocationsTTL (plus one store read) and the connections this replica holds with that
// credential (kite connections, terminals, port forwards, SSH) are closed then too; this
// replica's own revocations count, and close, at once.
type storeRevocations struct {
	r      *store.Revocations
	mu     sync.Mutex
	set    map[string]bool
	loaded time.Time
	// onRevoke is called with each credential this kloud revokes (logout, key revocation): the
	// relay closes the terminals, port forwards and SSH connections it opened (server.go).
	onRevoke func(jti string)
	// onRemote is called with each credential another replica revoked, once this replica's copy
	// sees it: it closes what onRevoke closes and the kite connections authenticated with it
	// (server.go; on the revoking replica kontrol and login close those).
	onRemote func(jti string)
	// alone says no other replica is live (mesh.alone): run then leaves the copy to IsRevoked.
	alone func() bool
}

// revocationsTTL bounds how long a revocation made by another replica takes to be enforced here.
const revocationsTTL = 5 * time.Second

func newStoreRevocations(r *store.Revocations) *storeRevocations { return &storeRevocations{r: r} }

func (s *storeRevocations) IsRevoked(ctx context.Context, jti string) (bool, error) {
	s.mu.Lock()
	var fresh []string
	if s.set == nil || time.Since(s.loaded) > revocationsTTL {
		var err error
		if fresh, err = s.reloadLocked(ctx); err != nil && s.set == nil {
			s.mu.Unlock()
			return false, wireError(err) // a store outage: storeUnavailable, not an internal error
		}
	}
	revoked := s.set[jti]
	onRemote := s.onRemote
	s.mu.Unlock()
	s.closeRemote(onRemote, fresh)
	return revoked, nil
}

// reloadLocked reads the revocations again (s.mu held) and returns those that are new since the
// last read (none at the first: what was revoked before this process started has no
// connection here). On an error the copy is kept.
func (s *storeRevocations) reloadLocked(ctx context.Context) ([]string, error) {
	list, err := s.r.ListRevoked(ctx)
	if err != nil {
		return nil, err
	}
	var fresh []string
	set := make(map[string]bool, len(list))
	for _, r := range list {
		set[r.JTI] = true
		if s.set != nil && !s.set[r.JTI] {
			fresh = append(fresh, r.JTI)
		}
	}
	s.set, s.loaded = set, time.Now()
	return fresh, nil
}

// closeRemote closes this replica's connections of credentials revoked elsewhere.
func (s *storeRevocations) closeRemote(onRemote func(string), jtis []string) {
	if onRemote == nil {
		return
	}
	for _, jti := range jtis {
		onRemote(jti)
	}
}

// run reloads the copy every revocationsTTL until ctx ends, so that the connections of a
// credential revoked by another replica close even when no handshake asks here.
func (s *storeRevocations) run(ctx context.Context) {
	t := time.NewTicker(revocationsTTL)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.alone != nil && s.alone() {
			continue // no other replica revokes: this one's revocations close their connections at once
		}
		s.mu.Lock()
		fresh, _ := s.reloadLocked(ctx) // an outage: the next tick tries again
		onRemote := s.onRemote
		s.mu.Unlock()
		s.closeRemote(onRemote, fresh)
	}
}

func (s *storeRevocations) Revoke(ctx context.Context, jti, reason string) error {
	// Kite keys never expire, so their revocation is kept for good.
	return s.RevokeUntil(ctx, jti, time.Now().AddDate(100, 0, 0), reason)
}

// RevokeUntil revokes a credential that expires at until (the record can go after that).
func (s *storeRevocations) RevokeUntil(ctx context.Context, jti string, until time.Time, reason string) error {
	if err := s.r.Revoke(ctx, jti, until, reason); err != nil {
		return err
	}
	s.mu.Lock()
	if s.set != nil {
		s.set[jti] = true
	}
	onRevoke := s.onRevoke
	s.mu.Unlock()
	if onRevoke != nil {
		onRevoke(jti)
	}
	return nil
}

// storePresence mirrors the registrations of machine agents into the store's kites collection
// (ARCHITECTURE §9: what another replica or an operator needs to see). It writes in the
// background, coalescing changes per kite, so a registration never waits for the store; other
// kites (a klient started by hand, tools) live only in kontrol's registry.
type storePresence struct {
	k       *store.Kites
	replica string
	log     *slog.Logger

	mu      sync.Mutex
	pending map[string]*kontrol.KiteInfo // id → latest registration, nil = removed
	wake    chan struct{}
}

func newStorePresence(k *store.Kites, replica string, log *slog.Logger) *storePresence {
	return &storePresence{k: k, replica: replica, log: log, pending: map[string]*kontrol.KiteInfo{}, wake: make(chan struct{}, 1)}
}

func (p *storePresence) queue(id string, i *kontrol.KiteInfo) {
	if !strings.HasPrefix(id, AgentKitePrefix) {
		return
	}
	p.mu.Lock()
	p.pending[id] = i
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *storePresence) Upsert(_ context.Context, i kontrol.KiteInfo) error {
	p.queue(i.Kite.ID, &i)
	return nil
}

func (p *storePresence) Remove(_ context.Context, id string) error {
	p.queue(id, nil)
	return nil
}

// run writes queued changes until ctx ends.
func (p *storePresence) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		batch := p.pending
		p.pending = map[string]*kontrol.KiteInfo{}
		p.mu.Unlock()
		p.write(ctx, batch)
	}
}

// presenceBatch is the most changes run hands to one store.Kites.Write.
const presenceBatch = 500

// write writes batch's changes (id → registration, nil = removed), presenceBatch per Write: a
// burst of registrations (agents reconnecting after a replica died, kloud restarted) costs a
// few round trips to the store, not one each. A failed command is logged and its changes
// dropped, as a failed single write was: the next registration of a kite writes it again, and
// the sweep of dead replicas and the pruner remove what a removal left.
func (p *storePresence) write(ctx context.Context, batch map[string]*kontrol.KiteInfo) {
	var ups []store.KiteRecord
	var rms []string
	flush := func() {
		if err := p.k.Write(ctx, ups, rms, p.replica); err != nil && ctx.Err() == nil {
			p.log.Warn("kite presence records", "upserts", len(ups), "removes", len(rms), "err", err)
		}
		ups, rms = ups[:0], rms[:0]
	}
	for id, i := range batch {
		if i == nil {
			rms = append(rms, id)
		} else {
			ups = append(ups, store.KiteRecord{
				ID: i.Kite.ID, Username: i.Kite.Username, Environment: i.Kite.Environment, Name: i.Kite.Name,
				Version: i.Kite.Version, Region: i.Kite.Region, Hostname: i.Kite.Hostname, URL: i.URL,
				Replica: p.replica, ConnectedAt: i.RegisteredAt, LastSeen: time.Now().UTC(),
			})
		}
		if len(ups)+len(rms) == presenceBatch {
			flush()
		}
	}
	flush()
}
