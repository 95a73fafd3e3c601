package kitekey

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
)

// KeyStore persists a keyring's key pairs, private halves included. FileStore keeps them in one
// JSON file; kontrol's Mongo store implements the same three methods, and Keyring works on
// either.
type KeyStore interface {
	// LoadKeys returns every stored key pair, retired ones included.
	LoadKeys(ctx context.Context) ([]*KeyPair, error)
	// AddKey stores a new key pair; a kid that is already stored is an error wrapping
	// kite.ErrConflict.
	AddKey(ctx context.Context, k *KeyPair) error
	// RetireKey marks the key kid retired at at (a no-op if it already is); an unknown kid is an
	// error wrapping kite.ErrNotFound.
	RetireKey(ctx context.Context, kid string, at time.Time) error
}

// KeyringOptions configure NewKeyring.
type KeyringOptions struct {
	Store KeyStore // required
	// MinRefresh bounds how often an unknown kid makes the keyring reload from the store (another
	// replica may have rotated). Default 10s.
	MinRefresh time.Duration
	Now        func() time.Time // nil: time.Now
}

// Keyring holds kontrol's signing keys: the current one signs, every key not retired verifies.
// It caches the store's keys, reloads them (at most every MinRefresh) when asked for an unknown
// kid, and on Refresh. It is a KeySource and is safe for concurrent use.
type Keyring struct {
	store      KeyStore
	minRefresh time.Duration
	now        func() time.Time

	op chan struct{} // held for every store operation (reload, rotate, retire); a channel so waiters can give up on ctx

	mu       sync.RWMutex
	keys     []*KeyPair // snapshot; replaced, never modified in place
	loadedAt time.Time  // last reload attempt
}

var _ KeySource = (*Keyring)(nil)

// NewKeyring loads the keys in opts.Store; if none of them can sign (an empty store, or only
// retired keys), it generates one and stores it.
func NewKeyring(ctx context.Context, opts KeyringOptions) (*Keyring, error) {
	if opts.Store == nil {
		return nil, fmt.Errorf("new keyring: no store")
	}
	k := &Keyring{store: opts.Store, minRefresh: opts.MinRefresh, now: opts.Now, op: make(chan struct{}, 1)}
	if k.minRefresh <= 0 {
		k.minRefresh = 10 * time.Second
	}
	if k.now == nil {
		k.now = time.Now
	}
	if err := k.Refresh(ctx); err != nil {
		return nil, fmt.Errorf("new keyring: %w", err)
	}
	if k.Current() == nil {
		if _, err := k.Rotate(ctx); err != nil {
			return nil, fmt.Errorf("new keyring: %w", err)
		}
	}
	return k, nil
}

// Current returns the key that signs: the newest key that is not retired. Pass k.Current as
// Signer.Current to follow rotation.
func (k *Keyring) Current() *KeyPair {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return current(k.keys)
}

func current(keys []*KeyPair) *KeyPair {
	var cur *KeyPair
	for _, kp := range keys {
		if !kp.Retired() && (cur == nil || !kp.CreatedAt.Before(cur.CreatedAt)) {
			cur = kp
		}
	}
	return cur
}

// Rotate generates a key, stores it and makes it current. Older keys keep verifying until they
// are retired, so tokens already handed out stay valid.
func (k *Keyring) Rotate(ctx context.Context) (*KeyPair, error) {
	release, err := k.acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("rotate keys: %w", err)
	}
	defer release()
	kp, err := GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("rotate keys: %w", err)
	}
	kp.CreatedAt = k.now().UTC()
	if cur := k.Current(); cur != nil && !kp.CreatedAt.After(cur.CreatedAt) {
		kp.CreatedAt = cur.CreatedAt.Add(time.Nanosecond) // a clock step back must not leave the old key current
	}
	if err := k.store.AddKey(ctx, kp); err != nil {
		return nil, fmt.Errorf("rotate keys: %w", err)
	}
	k.mu.Lock()
	k.keys = append(slices.Clip(k.keys), kp)
	k.mu.Unlock()
	return kp, nil
}

// Retire stops the key kid from verifying. The current key cannot be retired (rotate first):
// that is an error wrapping kite.ErrState; an unknown kid wraps kite.ErrNotFound. Retiring a
// retired key does nothing.
func (k *Keyring) Retire(ctx context.Context, kid string) error {
	release, err := k.acquire(ctx)
	if err != nil {
		return fmt.Errorf("retire key %q: %w", kid, err)
	}
	defer release()
	k.mu.RLock()
	keys := k.keys
	k.mu.RUnlock()
	i := slices.IndexFunc(keys, func(kp *KeyPair) bool { return kp.ID == kid })
	switch {
	case i < 0:
		return fmt.Errorf("retire key %q: %w", kid, kite.ErrNotFound)
	case keys[i].Retired():
		return nil
	case keys[i] == current(keys):
		return fmt.Errorf("retire key %q: it is the current signing key; rotate first: %w", kid, kite.ErrState)
	}
	at := k.now().UTC()
	if err := k.store.RetireKey(ctx, kid, at); err != nil {
		return fmt.Errorf("retire key %q: %w", kid, err)
	}
	retired := *keys[i]
	retired.RetiredAt = &at
	keys = slices.Clone(keys)
	keys[i] = &retired
	k.mu.Lock()
	k.keys = keys
	k.mu.Unlock()
	return nil
}

// Public returns the public halves of the keys that verify, for kontrol's getKey.
func (k *Keyring) Public() []PublicKey {
	k.mu.RLock()
	defer k.mu.RUnlock()
	var out []PublicKey
	for _, kp := range k.keys {
		if !kp.Retired() {
			out = append(out, kp.JWK())
		}
	}
	return out
}

// PublicKey implements KeySource. An unknown kid makes the keyring reload from its store first,
// at most once per MinRefresh.
func (k *Keyring) PublicKey(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	if pub, ok, err := k.lookup(kid); ok {
		return pub, err
	}
	release, err := k.acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("look up key %q: %w", short(kid), err)
	}
	defer release()
	if pub, ok, err := k.lookup(kid); ok { // reloaded while we waited
		return pub, err
	}
	k.mu.RLock()
	recent := k.now().Sub(k.loadedAt) < k.minRefresh
	k.mu.RUnlock()
	if !recent {
		if err := k.refresh(ctx); err != nil {
			return nil, fmt.Errorf("look up key %q: %w", short(kid), err)
		}
		if pub, ok, err := k.lookup(kid); ok {
			return pub, err
		}
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownKey, short(kid))
}

// lookup finds kid in the snapshot; ok is false if it is not there.
func (k *Keyring) lookup(kid string) (pub ed25519.PublicKey, ok bool, err error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	for _, kp := range k.keys {
		if kp.ID == kid {
			if kp.Retired() {
				return nil, true, fmt.Errorf("%w: %q at %s", ErrKeyRetired, kid, kp.RetiredAt.Format(time.RFC3339))
			}
			return kp.Public, true, nil
		}
	}
	return nil, false, nil
}

// Refresh reloads the keys from the store, picking up rotations and retirements made by other
// replicas. kontrol calls it periodically when several replicas share a store.
func (k *Keyring) Refresh(ctx context.Context) error {
	release, err := k.acquire(ctx)
	if err != nil {
		return fmt.Errorf("reload keys: %w", err)
	}
	defer release()
	return k.refresh(ctx)
}

func (k *Keyring) acquire(ctx context.Context) (release func(), err error) {
	select {
	case k.op <- struct{}{}:
		return func() { <-k.op }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// refresh reloads; the caller holds k.op.
func (k *Keyring) refresh(ctx context.Context) error {
	k.mu.Lock()
	k.loadedAt = k.now()
	k.mu.Unlock()
	keys, err := k.store.LoadKeys(ctx)
	if err != nil {
		return fmt.Errorf("load keys: %w", err)
	}
	for _, kp := range keys {
		if kp == nil || len(kp.Public) != ed25519.PublicKeySize || len(kp.Private) != ed25519.PrivateKeySize ||
			!bytes.Equal(kp.Private[32:], kp.Public) || kp.ID != KeyID(kp.Public) {
			return fmt.Errorf("load keys: store returned an invalid key pair")
		}
	}
	k.mu.Lock()
	k.keys = slices.Clip(keys)
	k.mu.Unlock()
	return nil
}
