package store

import (
	"errors"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/kloud-dev/kloud/kite"
)

// storeError is a store sentinel that also matches a kite sentinel through Unwrap, so
// errors.Is(err, store.ErrNotFound) and errors.Is(err, kite.ErrNotFound) both hold.
type storeError struct {
	msg  string
	kind error
}

func (e *storeError) Error() string { return e.msg }
func (e *storeError) Unwrap() error { return e.kind }

// Sentinel errors. Every error the store returns for these conditions wraps one of them, with
// a message saying which document and why.
var (
	// ErrNotFound: the document does not exist.
	ErrNotFound error = &storeError{"store: not found", kite.ErrNotFound}
	// ErrLocked: a lease (or a job's runner lease) is held by someone else.
	ErrLocked error = &storeError{"store: locked", kite.ErrConflict}
	// ErrLeaseLost: the caller no longer holds the lease it tried to renew or release.
	ErrLeaseLost error = &storeError{"store: lease not held", kite.ErrConflict}
	// ErrConflict: a document with that id or unique key already exists.
	ErrConflict error = &storeError{"store: already exists", kite.ErrConflict}
	// ErrState: the document is not in a state that allows the operation (e.g. finishing a
	// job that already finished).
	ErrState error = &storeError{"store: not allowed in this state", kite.ErrState}
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store: closed")
)

// IsDuplicateKey reports whether err is a duplicate-key error (E11000) from an insert or
// upsert, on MongoDB and on FerretDB alike.
func IsDuplicateKey(err error) bool {
	return mongo.IsDuplicateKeyError(err)
}
