package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Snapshot writes a consistent copy of the whole embedded database to dst (a new file; it must
// not exist): SQLite's VACUUM INTO, which reads every collection inside one read transaction,
// so the copy is the database as it was at one instant, whatever kloud writes meanwhile (its
// writes wait or go on beside it; nothing is paused). dst is a database file FerretDB opens as
// <data dir>/db/<database>.sqlite. With MongoURL there is no such snapshot: the error wraps
// errors.ErrUnsupported (use mongodump --oplog on a replica set).
func (s *Store) Snapshot(ctx context.Context, dst string) error {
	if s.embedded == nil {
		return fmt.Errorf("snapshot of an external MongoDB: take it with mongodump --oplog: %w", errors.ErrUnsupported)
	}
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("snapshot: %s exists", dst)
	}
	src := filepath.Join(s.embedded.dbDir, DatabaseFile(s.opts.Database))
	db, err := sql.Open("sqlite", "file:"+src+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, dst); err != nil {
		os.Remove(dst)
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// DatabaseFile is the embedded database's file name under <data dir>/db/ for database name db
// ("" for the default, "kloud").
func DatabaseFile(db string) string {
	if db == "" {
		db = "kloud"
	}
	return db + ".sqlite"
}

// SealWithKey is [Store.Seal] with a key given here (KeySize bytes), for what is sealed outside
// an open store (backups).
func SealWithKey(key, plaintext, aad []byte) ([]byte, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	return (&Store{aead: aead}).Seal(plaintext, aad)
}

// OpenWithKey is [Store.Open] with a key given here.
func OpenWithKey(key, ciphertext, aad []byte) ([]byte, error) {
	aead, err := newAEAD(key)
	if err != nil {
		return nil, err
	}
	return (&Store{aead: aead}).Open(ciphertext, aad)
}

// SecretKeyFile is the secret key's file in the data directory (when Options.SecretKey is not
// set).
const SecretKeyFile = "secret.key"

// ServerTime is the database server's clock (the hello command's localTime), for a clock
// skew check: kloud's leases and tokens assume its clock and the store's agree.
func (s *Store) ServerTime(ctx context.Context) (time.Time, error) {
	var res struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := s.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&res); err != nil {
		if IsUnavailable(err) {
			return time.Time{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return time.Time{}, fmt.Errorf("server time: %w", err)
	}
	if res.LocalTime.IsZero() {
		return time.Time{}, errors.New("server time: the database's hello has no localTime")
	}
	return res.LocalTime, nil
}

// doctorDoc is the scratch document of AtomicCheck in the meta collection.
const doctorDoc = "doctor"

// AtomicCheck checks that the store's conditional single-document updates are atomic, which
// jobs' claims, leases and quotas rely on: n concurrent findOneAndUpdate $inc on a scratch
// document must each see a different value and add up. It fails on a backend that loses or
// repeats updates (e.g. FerretDB v1 behind several connections).
func (s *Store) AtomicCheck(ctx context.Context) error {
	const n = 8
	coll := s.Collection(CollMeta)
	if _, err := coll.InsertOne(ctx, bson.M{"_id": doctorDoc, "n": int64(0)}); err != nil && !IsDuplicateKey(err) {
		if IsUnavailable(err) {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return fmt.Errorf("atomic update check: %w", err)
	}
	seen := make(chan int64, n)
	errc := make(chan error, n)
	for range n {
		go func() {
			var doc struct {
				N int64 `bson:"n"`
			}
			err := coll.FindOneAndUpdate(ctx, bson.M{"_id": doctorDoc}, bson.M{"$inc": bson.M{"n": int64(1)}},
				options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&doc)
			if err != nil {
				errc <- err
				return
			}
			seen <- doc.N
		}()
	}
	got := map[int64]bool{}
	for range n {
		select {
		case err := <-errc:
			if IsUnavailable(err) {
				return fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			return fmt.Errorf("atomic update check: %w", err)
		case v := <-seen:
			if got[v] {
				return fmt.Errorf("atomic update check: two concurrent updates both saw n=%d: updates are not atomic (an external FerretDB v1 needs ?maxPoolSize=1)", v)
			}
			got[v] = true
		}
	}
	return nil
}
