package store

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Quotas is the quotas collection: an administrator's limits on what one user or one team may
// hold (kloud/quota.go). A document's id is its subject: "user/NAME" or "team/SLUG". No document:
// no quota.
type Quotas struct{ s *Store }

// Quotas returns the quotas repository.
func (s *Store) Quotas() *Quotas { return &Quotas{s} }

func (r *Quotas) coll() *mongo.Collection { return r.s.db.Collection(CollQuotas) }

// Quota is one subject's limits; 0 means no limit.
type Quota struct {
	ID        string    `bson:"_id"` // "user/NAME" or "team/SLUG"
	Machines  int64     `bson:"machines"`
	Cores     float64   `bson:"cores"`
	MemoryMB  int64     `bson:"memoryMB"`
	DiskMB    int64     `bson:"diskMB"`
	Buckets   int64     `bson:"buckets,omitempty"`  // bucket claims
	BucketMB  int64     `bson:"bucketMB,omitempty"` // the sum of the claims' max_size_mb
	UpdatedBy string    `bson:"updatedBy"`
	UpdatedAt time.Time `bson:"updatedAt"`
}

// Get returns subject's quota; none wraps ErrNotFound.
func (r *Quotas) Get(ctx context.Context, subject string) (Quota, error) {
	return findOne[Quota](ctx, r.coll(), "quota", subject, bson.M{"_id": subject})
}

// Set replaces subject's quota (one atomic upsert; updatedAt set now).
func (r *Quotas) Set(ctx context.Context, q Quota) error {
	q.UpdatedAt = r.s.Now()
	if _, err := r.coll().ReplaceOne(ctx, bson.M{"_id": q.ID}, q, options.Replace().SetUpsert(true)); err != nil {
		return fmt.Errorf("set quota %s: %w", q.ID, err)
	}
	return nil
}

// List returns every quota, by subject.
func (r *Quotas) List(ctx context.Context) ([]Quota, error) {
	qs, err := findAll[Quota](ctx, r.coll(), bson.M{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("list quotas: %w", err)
	}
	return qs, nil
}
