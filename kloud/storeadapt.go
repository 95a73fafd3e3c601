package kloud

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kloud-dev/kloud/kite"
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
	err := s.k.Add(ctx, store.KeyRecord{ID: k.ID, Alg: "EdDSA", Public: k.Public, Private: k.Private, CreatedAt: k.CreatedAt, RetiredAt: k.RetiredAt})
	if errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("key %s: %w", k.ID, kite.ErrConflict)
	}
	return err
}

func (s storeKeys) RetireKey(ctx context.Context, kid string, at time.Time) error {
	err := s.k.Retire(ctx, kid, at)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("key %s: %w", kid, kite.ErrNotFound)
	}
	return err
}

// storeRevocations keeps revoked credential ids in the store.
type storeRevocations struct{ r *store.Revocations }

func (s storeRevocations) IsRevoked(ctx context.Context, jti string) (bool, error) {
	return s.r.IsRevoked(ctx, jti)
}

func (s storeRevocations) Revoke(ctx context.Context, jti, reason string) error {
	// Kite keys never expire, so their revocation is kept for good.
	return s.r.Revoke(ctx, jti, time.Now().AddDate(100, 0, 0), reason)
}

// storePresence mirrors kontrol's registry into the store's kites collection.
type storePresence struct {
	k       *store.Kites
	replica string
}

func (p storePresence) Upsert(ctx context.Context, i kontrol.KiteInfo) error {
	now := time.Now().UTC()
	return p.k.Upsert(ctx, store.KiteRecord{
		ID: i.Kite.ID, Username: i.Kite.Username, Environment: i.Kite.Environment, Name: i.Kite.Name,
		Version: i.Kite.Version, Region: i.Kite.Region, Hostname: i.Kite.Hostname, URL: i.URL,
		Replica: p.replica, ConnectedAt: i.RegisteredAt, LastSeen: now,
	})
}

func (p storePresence) Remove(ctx context.Context, id string) error {
	_, err := p.k.Remove(ctx, id, p.replica)
	return err
}
