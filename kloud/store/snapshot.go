package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
