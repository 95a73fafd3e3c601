package kitekey

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"sync"
	"time"
)

// RemoteKeys is the KeySource of kites that are not kontrol: it fetches kontrol's public keys
// (kontrol.getKey) and caches them. An unknown kid makes it refetch, at most once per
// MinRefresh, so a rotation is picked up without a flood of fetches; cached keys older than
// MaxAge are refetched before use, so a retired key stops verifying within MaxAge. If a refetch
// fails, the keys already cached keep verifying (a kontrol outage must not lock users out of
// their machines) and the error is returned only when no cached key fits.
//
// The zero value is not usable: set Fetch. Safe for concurrent use.
type RemoteKeys struct {
	Fetch      func(ctx context.Context) ([]PublicKey, error) // required
	MinRefresh time.Duration                                  // default 10s
	MaxAge     time.Duration                                  // default 5m
	Now        func() time.Time                               // nil: time.Now

	once    sync.Once
	fetchMu chan struct{} // one fetch at a time; a channel so waiters can give up on ctx

	mu        sync.RWMutex
	keys      map[string]ed25519.PublicKey
	fetchedAt time.Time // last successful fetch
	triedAt   time.Time // last attempt
	lastErr   error     // error of the last attempt
}

var _ KeySource = (*RemoteKeys)(nil)

// PublicKey implements KeySource.
func (r *RemoteKeys) PublicKey(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	r.once.Do(func() { r.fetchMu = make(chan struct{}, 1) })
	if pub, fresh := r.cached(kid); pub != nil && fresh {
		return pub, nil
	}
	select {
	case r.fetchMu <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("look up key %q: %w", short(kid), ctx.Err())
	}
	defer func() { <-r.fetchMu }()

	pub, fresh := r.cached(kid) // fetched while we waited?
	if pub != nil && fresh {
		return pub, nil
	}
	r.mu.RLock()
	canFetch := r.triedAt.IsZero() || r.now().Sub(r.triedAt) >= r.minRefresh()
	r.mu.RUnlock()
	if canFetch {
		r.fetch(ctx)
		pub, _ = r.cached(kid)
	}
	if pub != nil {
		return pub, nil // fresh, or stale because kontrol cannot be reached
	}
	r.mu.RLock()
	lastErr := r.lastErr
	r.mu.RUnlock()
	if lastErr != nil {
		return nil, fmt.Errorf("look up key %q: fetch public keys: %w", short(kid), lastErr)
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownKey, short(kid))
}

// cached returns the cached key for kid (nil if none) and whether the cache is younger than
// MaxAge.
func (r *RemoteKeys) cached(kid string) (ed25519.PublicKey, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	maxAge := r.MaxAge
	if maxAge <= 0 {
		maxAge = 5 * time.Minute
	}
	return r.keys[kid], r.now().Sub(r.fetchedAt) < maxAge
}

// fetch replaces the cache with kontrol's current keys; the caller holds fetchMu.
func (r *RemoteKeys) fetch(ctx context.Context) {
	now := r.now()
	keys, err := r.Fetch(ctx)
	var m map[string]ed25519.PublicKey
	if err == nil {
		m = make(map[string]ed25519.PublicKey, len(keys))
		for _, k := range keys {
			pub, kerr := k.Ed25519()
			if kerr != nil {
				err = kerr
				break
			}
			m[k.ID] = pub
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Err() != nil && err != nil {
		return // our caller gave up; do not count it against the rate limit
	}
	r.triedAt, r.lastErr = now, err
	if err == nil {
		r.keys, r.fetchedAt = m, now
	}
}

func (r *RemoteKeys) minRefresh() time.Duration {
	if r.MinRefresh > 0 {
		return r.MinRefresh
	}
	return 10 * time.Second
}

func (r *RemoteKeys) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
