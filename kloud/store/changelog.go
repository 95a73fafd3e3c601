package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// CollChangeLog is the change log of several kloud replicas sharing one store ([ChangeLog]).
const CollChangeLog = "changelog"

// The change log (ARCHITECTURE §9, issue 24): what one kloud replica published to its event
// hub and its kontrol's watchers, for the other replicas to publish too. MongoDB change streams
// would do it on a replica set, but FerretDB (the embedded store and `kloud store serve`) has
// none, so the replicas keep this log themselves, on any MongoDB-protocol store.
//
// Each entry's _id is its sequence number 1, 2, 3… as a fixed-width string ([ChangeLogKey]:
// the embedded FerretDB answers only a string {_id: x} filter without a scan, doc.go), and the
// log has no holes: an entry is inserted with _id = the newest seq + 1, found by reading by _id
// forward from a guess, and the unique _id makes one of two racing writers retry with the next
// seq. An entry n+1 is therefore written only after entry n was seen, so a reader that finds
// entry n missing while a later one exists knows n was pruned (it fell behind): nothing is
// skipped silently. Pruning ([ChangeLog.Prune]) never removes the newest entry, so a replica
// that starts finds the head and never reuses a seq.

// ChangeLogEntry is one entry of the change log.
type ChangeLogEntry struct {
	Seq     int64     `bson:"seq"`
	Replica string    `bson:"replica"` // the replica that wrote it (Store.InstanceID)
	At      time.Time `bson:"at"`
	Body    string    `bson:"body"` // what the replica published, encoded by the caller (kloud: JSON)
}

type changeLogDoc struct {
	ID             string `bson:"_id"`
	ChangeLogEntry `bson:",inline"`
}

// ChangeLogKey is the _id of entry seq: 16 hex digits, so that string order is seq order.
func ChangeLogKey(seq int64) string { return fmt.Sprintf("%016x", seq) }

// ChangeLog is the replicas' change log in the changelog collection.
type ChangeLog struct{ s *Store }

// ChangeLog returns the change log API.
func (s *Store) ChangeLog() *ChangeLog { return &ChangeLog{s} }

func (l *ChangeLog) coll() *mongo.Collection { return l.s.db.Collection(CollChangeLog) }

// maxAppendProbes bounds how far Append reads forward or retries before giving up (a guess
// far behind a busy log).
const maxAppendProbes = 10000

// Append writes one entry per body, in order, each at the newest seq + 1, starting the search
// at guess (a seq known to be at most the newest + 1; 0 or less: from the head, a scan). It
// returns the seq of the last entry written. Entries of racing writers interleave.
func (l *ChangeLog) Append(ctx context.Context, guess int64, replica string, bodies ...string) (int64, error) {
	if guess < 1 {
		h, err := l.Head(ctx)
		if err != nil {
			return 0, err
		}
		guess = h + 1
	}
	seq := guess
	for _, b := range bodies {
		for probes := 0; ; probes++ {
			if probes > maxAppendProbes {
				return 0, fmt.Errorf("change log: no free seq after %d tries from %d", maxAppendProbes, guess)
			}
			_, err := l.coll().InsertOne(ctx, changeLogDoc{ID: ChangeLogKey(seq), ChangeLogEntry: ChangeLogEntry{Seq: seq, Replica: replica, At: l.s.Now(), Body: b}})
			if err == nil {
				break
			}
			if !IsDuplicateKey(err) {
				return 0, fmt.Errorf("change log: append %d: %w", seq, err)
			}
			seq++
		}
		seq++
	}
	return seq - 1, nil
}

// Get returns entry seq, or an error wrapping [ErrNotFound].
func (l *ChangeLog) Get(ctx context.Context, seq int64) (ChangeLogEntry, error) {
	var d changeLogDoc
	err := l.coll().FindOne(ctx, bson.M{"_id": ChangeLogKey(seq)}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return ChangeLogEntry{}, fmt.Errorf("change log entry %d: %w", seq, ErrNotFound)
	}
	if err != nil {
		return ChangeLogEntry{}, fmt.Errorf("change log entry %d: %w", seq, err)
	}
	return d.ChangeLogEntry, nil
}

// From returns up to limit entries from seq on, in order (a scan of the collection on the
// embedded backend: the log is kept small).
func (l *ChangeLog) From(ctx context.Context, seq int64, limit int) ([]ChangeLogEntry, error) {
	cur, err := l.coll().Find(ctx, bson.M{"_id": bson.M{"$gte": ChangeLogKey(seq)}},
		options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("change log from %d: %w", seq, err)
	}
	var docs []changeLogDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("change log from %d: %w", seq, err)
	}
	out := make([]ChangeLogEntry, len(docs))
	for i, d := range docs {
		out[i] = d.ChangeLogEntry
	}
	return out, nil
}

// Head returns the seq of the newest entry (0: the log is empty).
func (l *ChangeLog) Head(ctx context.Context) (int64, error) {
	var d changeLogDoc
	err := l.coll().FindOne(ctx, bson.M{}, options.FindOne().SetSort(bson.D{{Key: "_id", Value: -1}})).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("change log head: %w", err)
	}
	if n, err := strconv.ParseInt(d.ID, 16, 64); err != nil || n != d.Seq {
		return 0, fmt.Errorf("change log head: damaged entry %q", d.ID)
	}
	return d.Seq, nil
}

// Prune deletes the entries written before before, except the newest of all (head: the
// caller's reading of it; the entries from head on stay whatever their age), and returns how
// many it deleted.
func (l *ChangeLog) Prune(ctx context.Context, before time.Time, head int64) (int64, error) {
	res, err := l.coll().DeleteMany(ctx, bson.M{"at": bson.M{"$lt": before.UTC()}, "_id": bson.M{"$lt": ChangeLogKey(head)}})
	if err != nil {
		return 0, fmt.Errorf("prune change log: %w", err)
	}
	return res.DeletedCount, nil
}
