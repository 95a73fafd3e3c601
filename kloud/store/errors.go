package store

import (
	"errors"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Sentinel errors. Every error the store returns for these conditions wraps one of them, with
// a message saying which document and why. They belong to the store, not to any transport:
// kloud maps them to kite's error codes in one place (kloud/errors.go).
var (
	// ErrNotFound: the document does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrLocked: a lease (or a job's runner lease) is held by someone else.
	ErrLocked = errors.New("store: locked")
	// ErrLeaseLost: the caller no longer holds the lease it tried to renew or release.
	ErrLeaseLost = errors.New("store: lease not held")
	// ErrConflict: a document with that id or unique key already exists.
	ErrConflict = errors.New("store: already exists")
	// ErrState: the document is not in a state that allows the operation (e.g. finishing a
	// job that already finished).
	ErrState = errors.New("store: not allowed in this state")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store: closed")
)

// IsDuplicateKey reports whether err is a duplicate-key error (E11000) from an insert or
// upsert, on MongoDB and on FerretDB alike.
func IsDuplicateKey(err error) bool {
	return mongo.IsDuplicateKeyError(err)
}
