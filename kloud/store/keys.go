package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// KeyRecord is one kontrol signing key. Private is stored sealed ([Store.Seal], bound to the
// key id) and returned opened. A key with RetiredAt set still verifies tokens until the caller
// drops it; it no longer signs.
type KeyRecord struct {
	ID        string     `json:"kid"`
	Alg       string     `json:"alg"` // "EdDSA"
	Public    []byte     `json:"public"`
	Private   []byte     `json:"-"`
	CreatedAt time.Time  `json:"createdAt"`
	RetiredAt *time.Time `json:"retiredAt,omitempty"`
}

type keyDoc struct {
	ID            string     `bson:"_id"`
	Alg           string     `bson:"alg"`
	Public        []byte     `bson:"public"`
	PrivateSealed []byte     `bson:"privateSealed"`
	CreatedAt     time.Time  `bson:"createdAt"`
	RetiredAt     *time.Time `bson:"retiredAt,omitempty"`
}

func keyAAD(kid string) []byte { return []byte(CollKeys + "/" + kid) }

// Keys stores kontrol's signing keys in the keys collection.
type Keys struct{ s *Store }

// Keys returns the signing keys API.
func (s *Store) Keys() *Keys { return &Keys{s} }

// List returns all keys, oldest first, with their private halves opened.
func (k *Keys) List(ctx context.Context) ([]KeyRecord, error) {
	cur, err := k.s.Collection(CollKeys).Find(ctx, bson.M{}, options.Find().SetSort(bson.D{{Key: "createdAt", Value: 1}, {Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	var docs []keyDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	out := make([]KeyRecord, 0, len(docs))
	for _, d := range docs {
		priv, err := k.s.Open(d.PrivateSealed, keyAAD(d.ID))
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", d.ID, err)
		}
		out = append(out, KeyRecord{ID: d.ID, Alg: d.Alg, Public: d.Public, Private: priv, CreatedAt: d.CreatedAt, RetiredAt: d.RetiredAt})
	}
	return out, nil
}

// Add stores a new key. CreatedAt defaults to the store's clock. A key with the same id gives
// an error wrapping [ErrConflict].
func (k *Keys) Add(ctx context.Context, r KeyRecord) error {
	if r.ID == "" || r.Alg == "" || len(r.Public) == 0 || len(r.Private) == 0 {
		return errors.New("add key: id, alg, public and private are required")
	}
	sealed, err := k.s.Seal(r.Private, keyAAD(r.ID))
	if err != nil {
		return fmt.Errorf("add key %q: %w", r.ID, err)
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = k.s.Now()
	}
	_, err = k.s.Collection(CollKeys).InsertOne(ctx, keyDoc{
		ID: r.ID, Alg: r.Alg, Public: r.Public, PrivateSealed: sealed, CreatedAt: r.CreatedAt, RetiredAt: r.RetiredAt,
	})
	if IsDuplicateKey(err) {
		return fmt.Errorf("add key %q: %w", r.ID, ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("add key %q: %w", r.ID, err)
	}
	return nil
}

// Retire marks the key retired at the given time (it keeps an earlier retirement).
func (k *Keys) Retire(ctx context.Context, kid string, at time.Time) error {
	coll := k.s.Collection(CollKeys)
	res, err := coll.UpdateOne(ctx, bson.M{"_id": kid, "retiredAt": nil}, bson.M{"$set": bson.M{"retiredAt": at}})
	if err != nil {
		return fmt.Errorf("retire key %q: %w", kid, err)
	}
	if res.MatchedCount == 1 {
		return nil
	}
	n, err := coll.CountDocuments(ctx, bson.M{"_id": kid})
	if err != nil {
		return fmt.Errorf("retire key %q: %w", kid, err)
	}
	if n == 0 {
		return fmt.Errorf("key %q: %w", kid, ErrNotFound)
	}
	return nil // already retired
}

// Delete removes a key (after it is retired and no token it signed can still be valid).
func (k *Keys) Delete(ctx context.Context, kid string) error {
	res, err := k.s.Collection(CollKeys).DeleteOne(ctx, bson.M{"_id": kid})
	if err != nil {
		return fmt.Errorf("delete key %q: %w", kid, err)
	}
	if res.DeletedCount == 0 {
		return fmt.Errorf("key %q: %w", kid, ErrNotFound)
	}
	return nil
}

// Revocation records a revoked token or kite key by its jti. Until is when the revocation may
// be forgotten (the token's own expiry); zero means never (kite keys do not expire).
type Revocation struct {
	JTI       string    `bson:"_id" json:"jti"`
	Until     time.Time `bson:"until,omitempty" json:"until,omitzero"`
	Reason    string    `bson:"reason,omitempty" json:"reason,omitempty"`
	RevokedAt time.Time `bson:"revokedAt" json:"revokedAt"`
}

// Revocations stores revoked jtis in the revocations collection (_id = jti).
type Revocations struct{ s *Store }

// Revocations returns the revocations API.
func (s *Store) Revocations() *Revocations { return &Revocations{s} }

// Revoke records jti as revoked until the given time (zero: forever). Revoking again replaces
// the record.
func (r *Revocations) Revoke(ctx context.Context, jti string, until time.Time, reason string) error {
	if jti == "" {
		return errors.New("revoke: empty jti")
	}
	doc := Revocation{JTI: jti, Until: until.UTC(), Reason: reason, RevokedAt: r.s.Now()}
	_, err := r.s.Collection(CollRevocations).ReplaceOne(ctx, bson.M{"_id": jti}, doc, options.Replace().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("revoke %q: %w", jti, err)
	}
	return nil
}

// IsRevoked reports whether jti is revoked (a record exists, whatever its Until: a token
// past Until is expired anyway).
func (r *Revocations) IsRevoked(ctx context.Context, jti string) (bool, error) {
	err := r.s.Collection(CollRevocations).FindOne(ctx, bson.M{"_id": jti}).Err()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("is revoked %q: %w", jti, err)
	}
	return true, nil
}

// ListRevoked returns every revocation, oldest first.
func (r *Revocations) ListRevoked(ctx context.Context) ([]Revocation, error) {
	cur, err := r.s.Collection(CollRevocations).Find(ctx, bson.M{}, options.Find().SetSort(bson.D{{Key: "revokedAt", Value: 1}, {Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("list revoked: %w", err)
	}
	var out []Revocation
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("list revoked: %w", err)
	}
	return out, nil
}
