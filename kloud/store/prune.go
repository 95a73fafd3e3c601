package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Retention. What the store keeps and for how long is its caller's decision (kloud's retention
// task, kloud/retention.go, runs these on a schedule); the methods here delete what is past it.
// Each is a sequence of bounded batches, oldest records first, and each batch deletes only
// records that still qualify when it runs (one conditional delete, or on the embedded backend
// a check and a delete by _id under the store's write lock). A prune cancelled or killed midway
// therefore leaves exactly the records it had not reached yet, and running it again finishes
// the work.

// DefaultPruneBatch is how many records one batch of a prune deletes by default.
const DefaultPruneBatch = 100

// PruneOptions bound one prune.
type PruneOptions struct {
	// Batch is how many records one delete removes. Default DefaultPruneBatch.
	Batch int
	// AfterBatch, if set, is called after each batch with the number deleted so far (progress
	// logs; tests stop a prune midway with it).
	AfterBatch func(deleted int64)
}

func (o PruneOptions) batch() int {
	if o.Batch <= 0 {
		return DefaultPruneBatch
	}
	return o.Batch
}

// JobPrune selects the jobs [Jobs.Prune] deletes: finished (succeeded, failed or cancelled)
// before Before. Queued and running jobs never go, whatever their age.
type JobPrune struct {
	PruneOptions
	Before time.Time
	// KeepLatest, if set, is asked about every target (e.g. "stack/<id>") whose newest job
	// would be pruned; if it says true, that one job stays. kloud keeps the last job of every
	// stack, machine and credential that still exists, since it shows that job's id.
	KeepLatest func(ctx context.Context, target string) (bool, error)
}

// jobHead is the part of a job a prune reads.
type jobHead struct {
	ID         string    `bson:"_id"`
	Target     string    `bson:"target"`
	Status     JobStatus `bson:"status"`
	CreatedAt  time.Time `bson:"createdAt"`
	FinishedAt time.Time `bson:"finishedAt"`
}

func (h jobHead) prunable(before time.Time) bool {
	return h.Status.Done() && !h.FinishedAt.IsZero() && h.FinishedAt.Before(before)
}

// newer reports whether h is newer than o (created later; ids break ties, they sort by time).
func (h jobHead) newer(o jobHead) bool {
	if !h.CreatedAt.Equal(o.CreatedAt) {
		return h.CreatedAt.After(o.CreatedAt)
	}
	return h.ID > o.ID
}

// Prune deletes the jobs p selects, with their logs and progress (they live in the job's
// document), oldest first, and returns how many it deleted. On an error (ctx ended included)
// it returns the number deleted so far with the error.
func (js *Jobs) Prune(ctx context.Context, p JobPrune) (int64, error) {
	// One pass over the collection (a few fields of each job) finds the candidates and the
	// newest job of each target.
	cur, err := js.coll.Find(ctx, bson.M{}, options.Find().SetProjection(
		bson.M{"_id": 1, "target": 1, "status": 1, "createdAt": 1, "finishedAt": 1}))
	if err != nil {
		return 0, fmt.Errorf("prune jobs: %w", err)
	}
	newest := map[string]jobHead{}
	var cands []jobHead
	for cur.Next(ctx) {
		var h jobHead
		if err := cur.Decode(&h); err != nil {
			_ = cur.Close(ctx)
			return 0, fmt.Errorf("prune jobs: %w", err)
		}
		if n, ok := newest[h.Target]; !ok || h.newer(n) {
			newest[h.Target] = h
		}
		if h.prunable(p.Before) {
			cands = append(cands, h)
		}
	}
	if err := cur.Err(); err != nil {
		_ = cur.Close(ctx)
		return 0, fmt.Errorf("prune jobs: %w", err)
	}
	_ = cur.Close(ctx)

	if p.KeepLatest != nil {
		kept := cands[:0]
		for _, h := range cands {
			if newest[h.Target].ID == h.ID {
				keep, err := p.KeepLatest(ctx, h.Target)
				if err != nil {
					return 0, fmt.Errorf("prune jobs: %w", err)
				}
				if keep {
					continue
				}
			}
			kept = append(kept, h)
		}
		cands = kept
	}
	slices.SortFunc(cands, func(a, b jobHead) int {
		if c := a.FinishedAt.Compare(b.FinishedAt); c != 0 {
			return c
		}
		if a.ID < b.ID {
			return -1
		}
		return 1
	})

	var deleted int64
	for batch := range slices.Chunk(cands, p.batch()) {
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("prune jobs: %w", err)
		}
		n, err := js.deleteFinished(ctx, batch, p.Before)
		deleted += n
		if err != nil {
			return deleted, fmt.Errorf("prune jobs: %w", err)
		}
		if p.AfterBatch != nil {
			p.AfterBatch(deleted)
		}
	}
	return deleted, nil
}

// deleteFinished deletes the jobs of batch that are still finished before before.
func (js *Jobs) deleteFinished(ctx context.Context, batch []jobHead, before time.Time) (int64, error) {
	if js.s.embedded == nil {
		ids := make(bson.A, len(batch))
		for i, h := range batch {
			ids[i] = h.ID
		}
		res, err := js.coll.DeleteMany(ctx, bson.M{"_id": bson.M{"$in": ids},
			"status": bson.M{"$in": bson.A{JobSucceeded, JobFailed, JobCancelled}}, "finishedAt": bson.M{"$lt": before}})
		if err != nil {
			return 0, err
		}
		return res.DeletedCount, nil
	}
	// Embedded: by _id (a filter FerretDB does not have to scan for), each checked and deleted
	// under the write lock that every job write takes, one job at a time so other writes get
	// their turn in between.
	var n int64
	for _, h := range batch {
		ok, err := js.deleteOneFinished(ctx, h.ID, before)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

func (js *Jobs) deleteOneFinished(ctx context.Context, id string, before time.Time) (bool, error) {
	unlock := js.s.lockWrites()
	defer unlock()
	var h jobHead
	err := js.coll.FindOne(ctx, bson.M{"_id": id}, options.FindOne().SetProjection(
		bson.M{"_id": 1, "status": 1, "finishedAt": 1})).Decode(&h)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !h.prunable(before) {
		return false, nil
	}
	res, err := js.coll.DeleteOne(ctx, bson.M{"_id": id})
	if err != nil {
		return false, err
	}
	return res.DeletedCount == 1, nil
}

// pruneWhere deletes the documents of coll matching filter, oldest (by sortField) first, in
// batches: each batch is one conditional delete ({_id: {$in: batch}} and filter), atomic per
// document on both backends. For the small collections (revocations, kites, locks) only: on
// the embedded backend every batch scans the collection.
func (s *Store) pruneWhere(ctx context.Context, what, coll string, filter bson.M, sortField string, o PruneOptions) (int64, error) {
	var deleted int64
	for {
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("prune %s: %w", what, err)
		}
		cur, err := s.Collection(coll).Find(ctx, filter, options.Find().SetProjection(bson.M{"_id": 1}).
			SetSort(bson.D{{Key: sortField, Value: 1}, {Key: "_id", Value: 1}}).SetLimit(int64(o.batch())))
		if err != nil {
			return deleted, fmt.Errorf("prune %s: %w", what, err)
		}
		var docs []struct {
			ID string `bson:"_id"`
		}
		if err := cur.All(ctx, &docs); err != nil {
			return deleted, fmt.Errorf("prune %s: %w", what, err)
		}
		if len(docs) == 0 {
			return deleted, nil
		}
		ids := make(bson.A, len(docs))
		for i, d := range docs {
			ids[i] = d.ID
		}
		cond := bson.M{"_id": bson.M{"$in": ids}}
		for k, v := range filter {
			cond[k] = v
		}
		res, err := s.Collection(coll).DeleteMany(ctx, cond)
		if err != nil {
			return deleted, fmt.Errorf("prune %s: %w", what, err)
		}
		deleted += res.DeletedCount
		if o.AfterBatch != nil {
			o.AfterBatch(deleted)
		}
		if res.DeletedCount == 0 {
			return deleted, nil // all changed meanwhile; the next prune looks again
		}
	}
}

// Prune forgets revocations whose Until is before t (never the permanent ones: zero Until)
// and returns how many. A revocation can go once the token it revokes has expired, allowing
// for the verifiers' clock leeway: t is the caller's to choose with that margin.
func (r *Revocations) Prune(ctx context.Context, t time.Time, o PruneOptions) (int64, error) {
	return r.s.pruneWhere(ctx, "revocations", CollRevocations,
		bson.M{"until": bson.M{"$lt": t}}, "until", o)
}

// Prune deletes presence records not seen since before t (their replica died without
// removing them) and returns how many. A live replica keeps its records' LastSeen fresh with
// [Kites.TouchReplica].
func (k *Kites) Prune(ctx context.Context, t time.Time, o PruneOptions) (int64, error) {
	return k.s.pruneWhere(ctx, "kites", CollKites, bson.M{"lastSeen": bson.M{"$lt": t}}, "lastSeen", o)
}

// TouchReplica sets LastSeen of every record replica holds to now (one update), so [Kites.Prune]
// leaves a live replica's records alone. It returns how many records it touched.
func (k *Kites) TouchReplica(ctx context.Context, replica string, now time.Time) (int64, error) {
	res, err := k.s.Collection(CollKites).UpdateMany(ctx, bson.M{"replica": replica}, bson.M{"$set": bson.M{"lastSeen": now.UTC()}})
	if err != nil {
		return 0, fmt.Errorf("touch kites of %q: %w", replica, err)
	}
	return res.MatchedCount, nil
}

// PruneLeases deletes leases that expired before t and returns how many. Expired leases are
// harmless (they are takeable); this only keeps the collection small. A lease renewed or taken
// meanwhile no longer matches and stays.
func (s *Store) PruneLeases(ctx context.Context, t time.Time, o PruneOptions) (int64, error) {
	return s.pruneWhere(ctx, "leases", CollLocks, bson.M{"expiresAt": bson.M{"$lt": t}}, "expiresAt", o)
}
