package store

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/kloud-dev/kloud/kloud/model"
)

// BucketClaims is the buckets collection: stacks' claims on object buckets (model.BucketClaim),
// one per (stack, label), by id "<stackId>/<label>". Indexed by stackId and owner. Every change
// is one update of one document by _id.
type BucketClaims struct{ s *Store }

// BucketClaims returns the bucket claims repository.
func (s *Store) BucketClaims() *BucketClaims { return &BucketClaims{s} }

func (r *BucketClaims) coll() *mongo.Collection { return r.s.db.Collection(CollBuckets) }

// Ensure records claim c (state provisioning) unless a claim with its id exists; an existing
// one keeps its bucket, state and grants and takes c's retain and maxBytes. It returns the
// claim as recorded.
func (r *BucketClaims) Ensure(ctx context.Context, c model.BucketClaim) (model.BucketClaim, error) {
	c.CreatedAt = r.s.Now()
	c.UpdatedAt = c.CreatedAt
	if c.State == "" {
		c.State = model.BucketProvisioning
	}
	err := insert(ctx, r.coll(), "bucket claim", c.ID, c)
	if errors.Is(err, ErrConflict) {
		err = updateByID(ctx, r.coll(), "bucket claim", c.ID, bson.M{"$set": bson.M{
			"retain": c.Retain, "maxBytes": c.MaxBytes, "updatedAt": r.s.Now()}})
	}
	if err != nil {
		return model.BucketClaim{}, err
	}
	r.s.changed(Change{Coll: CollBuckets, ID: c.ID})
	return r.Get(ctx, c.ID)
}

// Get returns a claim; a missing one wraps ErrNotFound.
func (r *BucketClaims) Get(ctx context.Context, id string) (model.BucketClaim, error) {
	return findOne[model.BucketClaim](ctx, r.coll(), "bucket claim", id, bson.M{"_id": id})
}

// ByStack returns the claims of stack stackID, oldest first.
func (r *BucketClaims) ByStack(ctx context.Context, stackID string) ([]model.BucketClaim, error) {
	out, err := findAll[model.BucketClaim](ctx, r.coll(), bson.M{"stackId": stackID}, byCreation)
	if err != nil {
		return nil, fmt.Errorf("list bucket claims of stack %s: %w", stackID, err)
	}
	return out, nil
}

// ByStacks returns the claims of the stacks stackIDs, oldest first.
func (r *BucketClaims) ByStacks(ctx context.Context, stackIDs []string) ([]model.BucketClaim, error) {
	if len(stackIDs) == 0 {
		return []model.BucketClaim{}, nil
	}
	out, err := findAll[model.BucketClaim](ctx, r.coll(), bson.M{"stackId": in(stackIDs)}, byCreation)
	if err != nil {
		return nil, fmt.Errorf("list bucket claims: %w", err)
	}
	return out, nil
}

// Held returns the claims user owner holds (team "") or team holds (owner ""), or owner holds
// in team (both): what their bucket quotas count (kloud/quota).
func (r *BucketClaims) Held(ctx context.Context, owner, team string) ([]model.BucketClaim, error) {
	f := bson.M{}
	if owner != "" {
		f["owner"] = owner
	}
	if team != "" {
		f["team"] = team
	}
	if len(f) == 0 {
		return []model.BucketClaim{}, nil
	}
	out, err := findAll[model.BucketClaim](ctx, r.coll(), f, byCreation)
	if err != nil {
		return nil, fmt.Errorf("list bucket claims of %s%s: %w", owner, team, err)
	}
	return out, nil
}

// SetOwner gives the claims of stack stackID to owner (a prebuilt stack claimed by a user).
func (r *BucketClaims) SetOwner(ctx context.Context, stackID, owner string) error {
	if _, err := r.coll().UpdateMany(ctx, bson.M{"stackId": stackID}, bson.M{"$set": bson.M{"owner": owner, "updatedAt": r.s.Now()}}); err != nil {
		return fmt.Errorf("give the bucket claims of stack %s to %s: %w", stackID, owner, err)
	}
	return nil
}

// Granted returns the claims that grant user access (bucket.grant, or a machine's share),
// oldest first.
func (r *BucketClaims) Granted(ctx context.Context, user string) ([]model.BucketClaim, error) {
	out, err := findAll[model.BucketClaim](ctx, r.coll(), bson.M{"$or": bson.A{
		bson.M{"grants." + user: bson.M{"$exists": true}}, bson.M{"shareGrants." + user: bson.M{"$exists": true}}}}, byCreation)
	if err != nil {
		return nil, fmt.Errorf("list bucket claims granted to %s: %w", user, err)
	}
	return out, nil
}

// BucketClaimSet is a change to a claim; nil fields are left as they are.
type BucketClaimSet struct {
	State    *string
	Endpoint *string
	Region   *string
}

// Set changes claim id; a missing one wraps ErrNotFound.
func (r *BucketClaims) Set(ctx context.Context, id string, u BucketClaimSet) error {
	set := bson.M{"updatedAt": r.s.Now()}
	setIf(set, "state", u.State)
	setIf(set, "endpoint", u.Endpoint)
	setIf(set, "region", u.Region)
	return r.s.told(updateByID(ctx, r.coll(), "bucket claim", id, bson.M{"$set": set}), Change{Coll: CollBuckets, ID: id})
}

// SetGrant records that user has access ("read" or "write") to claim id's bucket.
func (r *BucketClaims) SetGrant(ctx context.Context, id, user, access string) error {
	return r.s.told(updateByID(ctx, r.coll(), "bucket claim", id, bson.M{"$set": bson.M{
		"grants." + user: access, "updatedAt": r.s.Now()}}), Change{Coll: CollBuckets, ID: id})
}

// SetShareGrants replaces claim id's grants from machine shares (username → access).
func (r *BucketClaims) SetShareGrants(ctx context.Context, id string, grants map[string]string) error {
	if grants == nil {
		grants = map[string]string{}
	}
	return r.s.told(updateByID(ctx, r.coll(), "bucket claim", id, bson.M{"$set": bson.M{"shareGrants": grants, "updatedAt": r.s.Now()}}), Change{Coll: CollBuckets, ID: id})
}

// RemoveGrant forgets user's grant on claim id (none: nothing changes).
func (r *BucketClaims) RemoveGrant(ctx context.Context, id, user string) error {
	return r.s.told(updateByID(ctx, r.coll(), "bucket claim", id, bson.M{
		"$unset": bson.M{"grants." + user: ""},
		"$set":   bson.M{"updatedAt": r.s.Now()}}), Change{Coll: CollBuckets, ID: id})
}

// Delete removes claim id; a missing one is no error (a destroy finishing an earlier one).
func (r *BucketClaims) Delete(ctx context.Context, id string) error {
	c := Change{Coll: CollBuckets, ID: id, Deleted: true}
	if r.s.watched() {
		if bc, err := r.Get(ctx, id); err == nil {
			c.Gone = bc
		}
	}
	if _, err := r.coll().DeleteOne(ctx, bson.M{"_id": id}); err != nil {
		return fmt.Errorf("delete bucket claim %s: %w", id, err)
	}
	r.s.changed(c)
	return nil
}
