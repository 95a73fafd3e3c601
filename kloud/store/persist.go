package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Defaults of [Store.Persist].
const (
	// DefaultPersistTimeout bounds all attempts of one Persist together.
	DefaultPersistTimeout = 3 * time.Minute
	// PersistAttemptTimeout bounds one attempt.
	PersistAttemptTimeout = 10 * time.Second
)

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that [Store.Persist] returns it at once instead of retrying.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether retrying the write that returned err cannot help: the document
// is missing or in another state, a key already exists, a lease is held by someone else or
// lost, the store is closed, or the caller marked err with [Permanent]. Everything else
// (timeouts, lost connections, server selection, a cancelled attempt) is worth another try.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrState) ||
		errors.Is(err, ErrConflict) || errors.Is(err, ErrLocked) || errors.Is(err, ErrLeaseLost) ||
		errors.Is(err, ErrClosed) || errors.Is(err, mongo.ErrNoDocuments) || errors.Is(err, mongo.ErrClientDisconnected) ||
		IsDuplicateKey(err)
}

// Persist runs fn, a write that must land (the bookkeeping of a state transition: a failed or
// cancelled job's final states, its log line), until it succeeds, returns a permanent error
// (see [IsPermanent]), or timeout (0: [DefaultPersistTimeout]) passes. Each attempt gets its own
// context, derived from ctx without its cancellation (a cancelled job's bookkeeping must still
// be written) and bounded by [PersistAttemptTimeout]. Failed attempts are logged at WARN and
// retried with exponential backoff (100ms doubling to 5s). It returns fn's last error, wrapped
// with what; a closed store ends the retries with [ErrClosed].
func (s *Store) Persist(ctx context.Context, what string, timeout time.Duration, fn func(ctx context.Context) error) error {
	if timeout <= 0 {
		timeout = DefaultPersistTimeout
	}
	base := context.WithoutCancel(ctx)
	deadline := time.Now().Add(timeout)
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if s.isClosed() {
			return fmt.Errorf("%s: %w", what, ErrClosed)
		}
		actx, cancel := context.WithTimeout(base, min(PersistAttemptTimeout, max(time.Until(deadline), time.Millisecond)))
		err := fn(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				s.log.Info("store write landed after retries", "what", what, "attempts", attempt)
			}
			return nil
		}
		if IsPermanent(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if time.Now().Add(backoff).After(deadline) {
			s.log.Error("store write given up", "what", what, "attempts", attempt, "err", err)
			return fmt.Errorf("%s: gave up after %d attempts: %w", what, attempt, err)
		}
		s.log.Warn("store write failed; retrying", "what", what, "attempt", attempt, "retry_in", backoff, "err", err)
		select {
		case <-time.After(backoff):
		case <-s.closed:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (s *Store) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}
