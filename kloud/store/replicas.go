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

// CollReplicas holds one record per running kloud replica (replicas.go).
const CollReplicas = "replicas"

// ReplicaRecord is the registry entry of one kloud process sharing the store (ARCHITECTURE §9):
// its id (the store's InstanceID, "<instance>.<boot>"), the URL other replicas reach it at, when
// it started, when it last said it was alive and when that stops counting. The replica keeps
// ExpiresAt ahead of the clock with [Replicas.Beat]; a record past it belongs to a dead replica
// (kloud's sweep removes it and its presence records: kloud/mesh.go).
type ReplicaRecord struct {
	ID          string    `bson:"_id" json:"id"`
	InternalURL string    `bson:"internalUrl" json:"internalUrl"`
	PublicURL   string    `bson:"publicUrl" json:"publicUrl"`
	Version     string    `bson:"version" json:"version"`
	StartedAt   time.Time `bson:"startedAt" json:"startedAt"`
	LastSeen    time.Time `bson:"lastSeen" json:"lastSeen"`
	ExpiresAt   time.Time `bson:"expiresAt" json:"expiresAt"`
}

// Replicas is the replica registry.
type Replicas struct{ s *Store }

// Replicas returns the replica registry API.
func (s *Store) Replicas() *Replicas { return &Replicas{s} }

func (r *Replicas) coll() *mongo.Collection { return r.s.Collection(CollReplicas) }

// Beat writes rec (one upsert by _id): LastSeen is now, ExpiresAt now+ttl, StartedAt set on the
// first beat only.
func (r *Replicas) Beat(ctx context.Context, rec ReplicaRecord, ttl time.Duration) error {
	if rec.ID == "" || ttl <= 0 {
		return errors.New("replica beat: an id and a positive ttl are required")
	}
	now := r.s.Now()
	_, err := r.coll().UpdateOne(ctx, bson.M{"_id": rec.ID}, bson.M{
		"$set": bson.M{"internalUrl": rec.InternalURL, "publicUrl": rec.PublicURL, "version": rec.Version,
			"lastSeen": now, "expiresAt": now.Add(ttl)},
		"$setOnInsert": bson.M{"startedAt": now},
	}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("replica beat %q: %w", rec.ID, err)
	}
	return nil
}

// Get returns a replica's record (expired or not), or an error wrapping [ErrNotFound].
func (r *Replicas) Get(ctx context.Context, id string) (ReplicaRecord, error) {
	var rec ReplicaRecord
	err := r.coll().FindOne(ctx, bson.M{"_id": id}).Decode(&rec)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return rec, fmt.Errorf("replica %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return rec, fmt.Errorf("replica %q: %w", id, err)
	}
	return rec, nil
}

// List returns every record, live and expired, sorted by id.
func (r *Replicas) List(ctx context.Context) ([]ReplicaRecord, error) {
	return r.find(ctx, bson.M{})
}

// Expired returns the records whose ExpiresAt is before now.
func (r *Replicas) Expired(ctx context.Context, now time.Time) ([]ReplicaRecord, error) {
	return r.find(ctx, bson.M{"expiresAt": bson.M{"$lt": now.UTC()}})
}

func (r *Replicas) find(ctx context.Context, q bson.M) ([]ReplicaRecord, error) {
	cur, err := r.coll().Find(ctx, q, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("find replicas: %w", err)
	}
	var out []ReplicaRecord
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("find replicas: %w", err)
	}
	return out, nil
}

// Remove deletes a replica's record if it is still expired at now (one conditional delete: a
// replica that beat again meanwhile stays) and reports whether it did. A replica leaving
// cleanly removes its own with [Replicas.Leave].
func (r *Replicas) Remove(ctx context.Context, id string, now time.Time) (bool, error) {
	res, err := r.coll().DeleteOne(ctx, bson.M{"_id": id, "expiresAt": bson.M{"$lt": now.UTC()}})
	if err != nil {
		return false, fmt.Errorf("remove replica %q: %w", id, err)
	}
	return res.DeletedCount == 1, nil
}

// Leave deletes the replica's own record (a clean shutdown).
func (r *Replicas) Leave(ctx context.Context, id string) error {
	if _, err := r.coll().DeleteOne(ctx, bson.M{"_id": id}); err != nil {
		return fmt.Errorf("replica %q leaves: %w", id, err)
	}
	return nil
}

// RemoveReplica deletes every presence record replica holds (after it died) and returns their
// ids, so their machines' agents can be marked disconnected. A kite that already moved to
// another replica is not touched: its record names the other replica.
func (k *Kites) RemoveReplica(ctx context.Context, replica string) ([]string, error) {
	recs, err := k.ByReplica(ctx, replica)
	if err != nil {
		return nil, err
	}
	var gone []string
	for _, r := range recs {
		ok, err := k.Remove(ctx, r.ID, replica)
		if err != nil {
			return gone, err
		}
		if ok {
			gone = append(gone, r.ID)
		}
	}
	return gone, nil
}
