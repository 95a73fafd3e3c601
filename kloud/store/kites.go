package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// KiteRecord is the presence record of one registered kite (ARCHITECTURE §9): its identity,
// where it can be reached, which kloud/kontrol replica holds its connection and when it was
// last heard from. The record lives in the store so any replica can answer queries; the
// replica holding the connection keeps LastSeen fresh.
type KiteRecord struct {
	ID          string    `bson:"_id" json:"id"`
	Username    string    `bson:"username" json:"username"`
	Environment string    `bson:"environment" json:"environment"`
	Name        string    `bson:"name" json:"name"`
	Version     string    `bson:"version" json:"version"`
	Region      string    `bson:"region" json:"region"`
	Hostname    string    `bson:"hostname" json:"hostname"`
	URL         string    `bson:"url,omitempty" json:"url,omitempty"`
	Replica     string    `bson:"replica" json:"replica"`
	ConnectedAt time.Time `bson:"connectedAt" json:"connectedAt"`
	LastSeen    time.Time `bson:"lastSeen" json:"lastSeen"`
}

// kiteFields maps identity field names (as in the kite protocol's identity object) to
// document fields, for [Kites.Find].
var kiteFields = map[string]string{
	"id": "_id", "username": "username", "environment": "environment", "name": "name",
	"version": "version", "region": "region", "hostname": "hostname",
}

// Kites stores kite presence records in the kites collection (_id = kite id).
type Kites struct{ s *Store }

// Kites returns the kite presence API.
func (s *Store) Kites() *Kites { return &Kites{s} }

// Upsert writes the whole record (a registration, possibly moving the kite to another
// replica). ConnectedAt and LastSeen default to the store's clock.
func (k *Kites) Upsert(ctx context.Context, r KiteRecord) error {
	if r.ID == "" {
		return errors.New("upsert kite: empty id")
	}
	r.stamp(k.s.Now())
	_, err := k.s.Collection(CollKites).ReplaceOne(ctx, bson.M{"_id": r.ID}, r, options.Replace().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("upsert kite %q: %w", r.ID, err)
	}
	return nil
}

// stamp defaults ConnectedAt and LastSeen to now and puts both in UTC.
func (r *KiteRecord) stamp(now time.Time) {
	if r.ConnectedAt.IsZero() {
		r.ConnectedAt = now
	}
	if r.LastSeen.IsZero() {
		r.LastSeen = now
	}
	r.ConnectedAt, r.LastSeen = r.ConnectedAt.UTC(), r.LastSeen.UTC()
}

// Write applies a batch of presence changes: each record of upserts is written whole (as
// [Kites.Upsert]), and each id of removes is deleted if replica still owns it (as
// [Kites.Remove]). A replica writes its kites' registrations this way, a burst of them in three
// commands rather than one each: the old records of upserts go in one delete (by _id), the new
// ones in one unordered insert (a record another replica wrote in between stays, the newer),
// then the removals in one delete. Not one replace per record: FerretDB v1 replaces an
// existing document in time proportional to the collection (3,000 records: some 0.2 s each,
// where an insert or a delete by _id takes milliseconds). A reader may miss a moved record for
// the moment between the delete and the insert.
func (k *Kites) Write(ctx context.Context, upserts []KiteRecord, removes []string, replica string) error {
	now := k.s.Now()
	ids := make([]string, 0, len(upserts))
	docs := make([]any, 0, len(upserts))
	for _, r := range upserts {
		if r.ID == "" {
			return errors.New("write kites: empty id")
		}
		r.stamp(now)
		ids = append(ids, r.ID)
		docs = append(docs, r)
	}
	coll := k.s.Collection(CollKites)
	if len(ids) > 0 {
		dels := make([]mongo.WriteModel, len(ids))
		for i, id := range ids {
			dels[i] = mongo.NewDeleteOneModel().SetFilter(bson.M{"_id": id}) // by _id alone: indexed
		}
		if _, err := coll.BulkWrite(ctx, dels, options.BulkWrite().SetOrdered(false)); err != nil {
			return fmt.Errorf("write %d kite records: delete the old ones: %w", len(ids), err)
		}
		_, err := coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
		var bwe mongo.BulkWriteException
		if errors.As(err, &bwe) && bwe.WriteConcernError == nil && allDuplicateKeys(bwe.WriteErrors) {
			err = nil // another replica wrote those kites since: theirs is the newer record
		}
		if err != nil {
			return fmt.Errorf("write %d kite records: %w", len(ids), err)
		}
	}
	if len(removes) > 0 {
		if _, err := coll.DeleteMany(ctx, bson.M{"_id": bson.M{"$in": removes}, "replica": replica}); err != nil {
			return fmt.Errorf("remove %d kite records: %w", len(removes), err)
		}
	}
	return nil
}

// allDuplicateKeys reports whether every write error is a duplicate key.
func allDuplicateKeys(errs []mongo.BulkWriteError) bool {
	for _, e := range errs {
		if !mongo.IsDuplicateKeyError(e) {
			return false
		}
	}
	return true
}

// Touch sets the kite's LastSeen. A missing record gives an error wrapping [ErrNotFound].
func (k *Kites) Touch(ctx context.Context, id string, now time.Time) error {
	res, err := k.s.Collection(CollKites).UpdateOne(ctx, bson.M{"_id": id}, bson.M{"$set": bson.M{"lastSeen": now.UTC()}})
	if err != nil {
		return fmt.Errorf("touch kite %q: %w", id, err)
	}
	if res.MatchedCount == 0 {
		return fmt.Errorf("kite %q: %w", id, ErrNotFound)
	}
	return nil
}

// Remove deletes the record only if replica still owns it (the kite may have reconnected to
// another replica meanwhile) and reports whether it did.
func (k *Kites) Remove(ctx context.Context, id, replica string) (bool, error) {
	res, err := k.s.Collection(CollKites).DeleteOne(ctx, bson.M{"_id": id, "replica": replica})
	if err != nil {
		return false, fmt.Errorf("remove kite %q: %w", id, err)
	}
	return res.DeletedCount == 1, nil
}

// Get returns the record, or an error wrapping [ErrNotFound].
func (k *Kites) Get(ctx context.Context, id string) (KiteRecord, error) {
	var r KiteRecord
	err := k.s.Collection(CollKites).FindOne(ctx, bson.M{"_id": id}).Decode(&r)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return KiteRecord{}, fmt.Errorf("kite %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return KiteRecord{}, fmt.Errorf("kite %q: %w", id, err)
	}
	return r, nil
}

// Find returns the records matching every given identity field exactly (any subset of id,
// username, environment, name, version, region, hostname; empty values are ignored), sorted
// by id. An unknown field is an error.
func (k *Kites) Find(ctx context.Context, filter map[string]string) ([]KiteRecord, error) {
	q := bson.M{}
	for f, v := range filter {
		df, ok := kiteFields[f]
		if !ok {
			names := make([]string, 0, len(kiteFields))
			for n := range kiteFields {
				names = append(names, n)
			}
			sort.Strings(names)
			return nil, fmt.Errorf("find kites: unknown field %q (want one of %s)", f, strings.Join(names, ", "))
		}
		if v != "" {
			q[df] = v
		}
	}
	return k.find(ctx, q)
}

// ByReplica returns the records held by a replica (e.g. to clean up after it died).
func (k *Kites) ByReplica(ctx context.Context, replica string) ([]KiteRecord, error) {
	return k.find(ctx, bson.M{"replica": replica})
}

func (k *Kites) find(ctx context.Context, q bson.M) ([]KiteRecord, error) {
	cur, err := k.s.Collection(CollKites).Find(ctx, q, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("find kites: %w", err)
	}
	var out []KiteRecord
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("find kites: %w", err)
	}
	return out, nil
}
