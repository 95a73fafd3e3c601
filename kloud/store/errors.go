package store

import (
	"context"
	"errors"
	"strings"
	"syscall"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
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
	// ErrUnavailable: the database does not answer (down, unreachable, or no server could be
	// selected within Options.ServerSelectionTimeout). The driver's own errors for this are
	// recognised by [IsUnavailable]; [Store.Ping] wraps this sentinel.
	ErrUnavailable = errors.New("store: unavailable")
)

// IsUnavailable reports whether err says the database could not be reached: it wraps
// [ErrUnavailable], or it is the driver's server-selection, connection or network error (every
// store method wraps the driver's errors with %w, so this holds for their errors too). Apart
// from a failed server selection, a caller's own deadline or cancellation is not unavailability.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	// No server could be selected: the driver enforces ServerSelectionTimeout as a deadline, so
	// this error wraps context.DeadlineExceeded too.
	var sel topology.ServerSelectionError
	if errors.As(err, &sel) {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var conn topology.ConnectionError
	return errors.As(err, &conn) || mongo.IsNetworkError(err)
}

// IsDiskFull reports whether err says the database could not write because its disk is full:
// the embedded store's SQLite ("database or disk is full", SQLITE_FULL; the transaction is
// rolled back, nothing half-written), MongoDB's OutOfDiskSpace (14031) or ENOSPC. The store
// works again once there is space; nothing needs a restart.
func IsDiskFull(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.ENOSPC) {
		return true
	}
	var se mongo.ServerError
	if errors.As(err, &se) && se.HasErrorCode(14031) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "database or disk is full") || strings.Contains(msg, "No space left on device") ||
		strings.Contains(msg, "no space left on device")
}

// IsDuplicateKey reports whether err is a duplicate-key error (E11000) from an insert or
// upsert, on MongoDB and on FerretDB alike.
func IsDuplicateKey(err error) bool {
	return mongo.IsDuplicateKeyError(err)
}
