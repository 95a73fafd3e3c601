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

// Lease is a named lock with an owner and an expiry, stored in the locks collection. A lease
// whose owner died becomes takeable when it expires: that is how another replica, or kloud
// after a restart, picks up the work the lease guarded. Holders renew well before ExpiresAt.
type Lease struct {
	Name       string    `bson:"_id" json:"name"`
	Owner      string    `bson:"owner" json:"owner"`
	AcquiredAt time.Time `bson:"acquiredAt" json:"acquiredAt"`
	ExpiresAt  time.Time `bson:"expiresAt" json:"expiresAt"`
	// Holder is the process that last took or renewed the lease (Store.InstanceID): a lease
	// whose holder was an earlier process of this store's instance is dead at once, not only
	// at ExpiresAt (instance.go). Empty in leases written before it was recorded.
	Holder string `bson:"holder,omitempty" json:"holder,omitempty"`

	s *Store
}

// AcquireLease takes the lease name for owner for ttl, with one atomic upsert: it succeeds if
// nobody holds the lease, the holder's lease expired, its holder was an earlier process of this
// store's instance (instance.go), or owner already holds it (then it is
// extended and AcquiredAt kept). Otherwise it returns an error wrapping [ErrLocked] that says
// who holds it until when.
func (s *Store) AcquireLease(ctx context.Context, name, owner string, ttl time.Duration) (*Lease, error) {
	if name == "" || owner == "" || ttl <= 0 {
		return nil, fmt.Errorf("acquire lease %q: name, owner and a positive ttl are required", name)
	}
	coll := s.Collection(CollLocks)
	// A lost race below (the holder released or its lease expired between our upsert and our
	// read) is retried a few times; more than that means heavy contention, reported as locked.
	for range 3 {
		now := s.Now()
		filter := bson.M{"_id": name, "$or": bson.A{
			bson.M{"expiresAt": bson.M{"$lt": now}},
			bson.M{"owner": owner},
			s.deadHolderFilter("holder"), // an earlier process of this instance: gone
		}}
		// acquiredAt is reset only when the owner changes: an update pipeline would express
		// that, but FerretDB v1 has none, so it is read back from the previous document.
		var prev Lease
		err := coll.FindOneAndUpdate(ctx, filter,
			bson.M{"$set": bson.M{"owner": owner, "holder": s.instance, "expiresAt": now.Add(ttl)}, "$setOnInsert": bson.M{"acquiredAt": now}},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before),
		).Decode(&prev)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments): // inserted: a fresh lease
			return &Lease{Name: name, Owner: owner, Holder: s.instance, AcquiredAt: now, ExpiresAt: now.Add(ttl), s: s}, nil
		case err == nil:
			l := &Lease{Name: name, Owner: owner, Holder: s.instance, AcquiredAt: prev.AcquiredAt, ExpiresAt: now.Add(ttl), s: s}
			if prev.Owner != owner {
				// Taken over from an expired holder: the lease starts now.
				l.AcquiredAt = now
				if _, err := coll.UpdateOne(ctx, bson.M{"_id": name, "owner": owner}, bson.M{"$set": bson.M{"acquiredAt": now}}); err != nil {
					return nil, fmt.Errorf("acquire lease %q: %w", name, err)
				}
				s.log.Info("lease taken over", "lease", name, "owner", owner, "previous_owner", prev.Owner, "expired_at", prev.ExpiresAt,
					"previous_holder_dead", s.EarlierProcess(prev.Holder))
			}
			return l, nil
		case IsDuplicateKey(err):
			// The document exists and the filter did not match it: held by someone else.
			cur, gerr := s.LeaseHolder(ctx, name)
			if errors.Is(gerr, ErrNotFound) {
				continue // released or expired just now
			}
			if gerr != nil {
				return nil, fmt.Errorf("acquire lease %q: %w", name, gerr)
			}
			if cur.Owner == owner {
				continue
			}
			return nil, fmt.Errorf("lease %q held by %q until %s: %w", name, cur.Owner, cur.ExpiresAt.Format(time.RFC3339Nano), ErrLocked)
		default:
			return nil, fmt.Errorf("acquire lease %q: %w", name, err)
		}
	}
	return nil, fmt.Errorf("lease %q: contended: %w", name, ErrLocked)
}

// LeaseHolder returns the current, unexpired holder of the lease, or an error wrapping
// [ErrNotFound] if nobody holds it.
func (s *Store) LeaseHolder(ctx context.Context, name string) (*Lease, error) {
	var l Lease
	err := s.Collection(CollLocks).FindOne(ctx, bson.M{"_id": name}).Decode(&l)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("lease %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("lease %q: %w", name, err)
	}
	if l.ExpiresAt.Before(s.Now()) {
		return nil, fmt.Errorf("lease %q: expired: %w", name, ErrNotFound)
	}
	if s.EarlierProcess(l.Holder) {
		return nil, fmt.Errorf("lease %q: its holder %s, an earlier process of this kloud, is gone: %w", name, l.Holder, ErrNotFound)
	}
	l.s = s
	return &l, nil
}

// RenewLease extends owner's lease to now+ttl. It succeeds while owner is still the recorded
// owner, even just after expiry if nobody took the lease meanwhile; otherwise it returns an
// error wrapping [ErrLeaseLost] and the caller must stop the guarded work.
func (s *Store) RenewLease(ctx context.Context, name, owner string, ttl time.Duration) (*Lease, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("renew lease %q: ttl must be positive", name)
	}
	now := s.Now()
	var l Lease
	err := s.Collection(CollLocks).FindOneAndUpdate(ctx,
		bson.M{"_id": name, "owner": owner},
		bson.M{"$set": bson.M{"expiresAt": now.Add(ttl), "holder": s.instance}},
		options.FindOneAndUpdate().SetReturnDocument(options.After),
	).Decode(&l)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("renew lease %q for %q: %w", name, owner, ErrLeaseLost)
	}
	if err != nil {
		return nil, fmt.Errorf("renew lease %q: %w", name, err)
	}
	l.s = s
	return &l, nil
}

// ReleaseLease deletes the lease if owner holds it. Releasing a lease owner does not hold
// (never had, already released, or taken over after expiry) returns an error wrapping
// [ErrLeaseLost] and changes nothing.
func (s *Store) ReleaseLease(ctx context.Context, name, owner string) error {
	res, err := s.Collection(CollLocks).DeleteOne(ctx, bson.M{"_id": name, "owner": owner})
	if err != nil {
		return fmt.Errorf("release lease %q: %w", name, err)
	}
	if res.DeletedCount == 0 {
		return fmt.Errorf("release lease %q for %q: %w", name, owner, ErrLeaseLost)
	}
	return nil
}

// Renew extends the lease to now+ttl; see [Store.RenewLease].
func (l *Lease) Renew(ctx context.Context, ttl time.Duration) error {
	n, err := l.s.RenewLease(ctx, l.Name, l.Owner, ttl)
	if err != nil {
		return err
	}
	l.ExpiresAt = n.ExpiresAt
	return nil
}

// Release gives the lease up; see [Store.ReleaseLease].
func (l *Lease) Release(ctx context.Context) error {
	return l.s.ReleaseLease(ctx, l.Name, l.Owner)
}
