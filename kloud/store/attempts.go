package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Attempts count attempts per key in windows, in the attempts collection, so that a limit (the
// web login's failed logins per user and address) holds across every kloud replica on the store
// rather than per process. A key's window starts at its first attempt and lasts the window
// given; each attempt is taken before it is made (Take: one conditional $inc, or one upsert that
// starts a new window), so two replicas racing never let more than limit attempts through in a
// window, and one that succeeded is forgotten (Reset). It is a fixed window: at most limit
// attempts in any window, 2×limit at most across a window's end.
type Attempts struct{ s *Store }

// Attempts returns the attempts API.
func (s *Store) Attempts() *Attempts { return &Attempts{s} }

// attemptID is the stored id of key.
func attemptID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// attemptWindow is one key's window.
type attemptWindow struct {
	Key       string    `bson:"_id"`
	Count     int       `bson:"count"`
	ExpiresAt time.Time `bson:"expiresAt"`
}

// Take takes one of key's limit attempts in its window: 0 if it may be made, else how long until
// the window ends (nothing taken).
func (a *Attempts) Take(ctx context.Context, key string, limit int, window time.Duration) (wait time.Duration, err error) {
	if key == "" || limit < 1 || window <= 0 {
		return 0, errors.New("take attempt: key, a positive limit and window are required")
	}
	key = attemptID(key)
	coll := a.s.Collection(CollAttempts)
	for range 3 {
		now := a.s.Now()
		// A window under way with attempts left: count this one.
		err := coll.FindOneAndUpdate(ctx, bson.M{"_id": key, "expiresAt": bson.M{"$gt": now}, "count": bson.M{"$lt": limit}},
			bson.M{"$inc": bson.M{"count": 1}}).Err()
		if err == nil {
			return 0, nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return 0, fmt.Errorf("take attempt %q: %w", key, err)
		}
		// None, or it ended: start a new window with this attempt. A window under way (full, or
		// started just now by another replica) makes the upsert's insert a duplicate key.
		_, err = coll.UpdateOne(ctx, bson.M{"_id": key, "expiresAt": bson.M{"$lte": now}},
			bson.M{"$set": bson.M{"count": 1, "expiresAt": now.Add(window)}}, options.UpdateOne().SetUpsert(true))
		if err == nil {
			return 0, nil
		}
		if !IsDuplicateKey(err) {
			return 0, fmt.Errorf("take attempt %q: %w", key, err)
		}
		var w attemptWindow
		err = coll.FindOne(ctx, bson.M{"_id": key}).Decode(&w)
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue // reset just now
		}
		if err != nil {
			return 0, fmt.Errorf("take attempt %q: %w", key, err)
		}
		if w.Count >= limit && w.ExpiresAt.After(now) {
			return w.ExpiresAt.Sub(now), nil
		}
		// A window started by another replica meanwhile, with attempts left: try again.
	}
	return time.Second, nil // heavy contention on one key: refused, try again soon
}

// Reset forgets key's attempts (its attempt succeeded).
func (a *Attempts) Reset(ctx context.Context, key string) error {
	key = attemptID(key)
	if _, err := a.s.Collection(CollAttempts).DeleteOne(ctx, bson.M{"_id": key}); err != nil {
		return fmt.Errorf("reset attempts %q: %w", key, err)
	}
	return nil
}

// Prune deletes the windows that ended before t and returns how many.
func (a *Attempts) Prune(ctx context.Context, t time.Time, o PruneOptions) (int64, error) {
	return a.s.pruneWhere(ctx, "attempts", CollAttempts, bson.M{"expiresAt": bson.M{"$lt": t}}, "expiresAt", o)
}
