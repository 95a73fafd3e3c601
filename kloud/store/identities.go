package store

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/kloud-dev/kloud/kloud/model"
)

// IdentityID is the _id of the identity of (issuer, subject). A space cannot end an issuer URL,
// so no two pairs share an id.
func IdentityID(issuer, subject string) string { return issuer + " " + subject }

// Identities is the identities collection (_id = IdentityID): which user a provider's subject
// is. The _id is the uniqueness: two first logins of one subject insert one binding.
type Identities struct{ s *Store }

// Identities returns the identities repository.
func (s *Store) Identities() *Identities { return &Identities{s} }

func (r *Identities) coll() *mongo.Collection { return r.s.db.Collection(CollIdentities) }

// Get returns the identity of (issuer, subject).
func (r *Identities) Get(ctx context.Context, issuer, subject string) (model.Identity, error) {
	id := IdentityID(issuer, subject)
	return findOne[model.Identity](ctx, r.coll(), "identity", id, bson.M{"_id": id})
}

// Insert binds an identity to a username; an existing binding of the same (issuer, subject)
// wraps ErrConflict.
func (r *Identities) Insert(ctx context.Context, i model.Identity) error {
	i.ID = IdentityID(i.Issuer, i.Subject)
	if i.CreatedAt.IsZero() {
		i.CreatedAt = r.s.Now()
	}
	return insert(ctx, r.coll(), "identity", i.ID, i)
}

// Delete removes the binding of (issuer, subject) if it names username (a first login that lost
// its username to a concurrent insert undoes its binding).
func (r *Identities) Delete(ctx context.Context, issuer, subject, username string) error {
	id := IdentityID(issuer, subject)
	if _, err := r.coll().DeleteOne(ctx, bson.M{"_id": id, "username": username}); err != nil {
		return fmt.Errorf("delete identity %s: %w", id, err)
	}
	return nil
}

// OfUser returns the identities bound to username.
func (r *Identities) OfUser(ctx context.Context, username string) ([]model.Identity, error) {
	return findAll[model.Identity](ctx, r.coll(), bson.M{"username": username})
}
