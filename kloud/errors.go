package kloud

import (
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// storeCodes maps the store's (and the provider contract's) sentinel errors to kite's. This is
// the one place where a store or provider condition becomes a wire error code: kloud/store and
// provider do not know about kite.
var storeCodes = []struct{ store, kite error }{
	{store.ErrNotFound, kite.ErrNotFound},
	{store.ErrConflict, kite.ErrConflict},
	{store.ErrLocked, kite.ErrConflict},
	{store.ErrLeaseLost, kite.ErrConflict},
	{store.ErrState, kite.ErrState},
	// A method the provider lacks the capability for (machine.stop of a provider without
	// stop): the machine is in no state where it could work.
	{provider.ErrUnsupported, kite.ErrState},
	// A snapshot or restore of a machine that is running (snapshots.go stops it first).
	{provider.ErrRunning, kite.ErrState},
	// A machine attribute outside the provider's constraints (constraints.go).
	{provider.ErrConstraint, kite.ErrInvalidParams},
	// A grant to a bucket the provisioner does not have (bucket.go).
	{provider.ErrBucketNotFound, kite.ErrNotFound},
	// The database does not answer; wireError checks store.IsUnavailable first, which also knows
	// the driver's own errors of an unreachable server, and says so in the message.
	{store.ErrUnavailable, kite.ErrStoreUnavailable},
}

// codedError is an error given the kite code of the store sentinel it wraps; its message is
// the original one.
type codedError struct{ err, code error }

func (e *codedError) Error() string   { return e.err.Error() }
func (e *codedError) Unwrap() []error { return []error{e.err, e.code} }

// wireError gives an error a handler returns the kite code of the store condition it wraps,
// unless it already carries a kite code (a handler's own decision wins). Every path by which a
// store error reaches a client goes through it: RPC handlers (handle, authz.go), HTTP handlers
// (writeErr, httpauth.go; the relays' through relayDeps, relay.go) and kontrol's key store (storeKeys, storeadapt.go).
func wireError(err error) error {
	if err == nil {
		return nil
	}
	var ke *kite.Error
	if errors.As(err, &ke) {
		return err
	}
	// The database does not answer (a driver error, or store.ErrUnavailable): its own code, so
	// a client tells "the store is down" from a bug (health.go logs the outage once).
	if store.IsUnavailable(err) {
		return &codedError{fmt.Errorf("store unavailable: %w", err), kite.ErrStoreUnavailable}
	}
	// The store's disk is full: nothing was written; it works again once there is space.
	if store.IsDiskFull(err) {
		return &codedError{fmt.Errorf("store unavailable: its disk is full, nothing was written (free space on the data directory's disk; no restart needed): %w", err), kite.ErrStoreUnavailable}
	}
	for _, m := range storeCodes {
		if errors.Is(err, m.store) {
			return &codedError{err, m.kite}
		}
	}
	return err
}
