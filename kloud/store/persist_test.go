package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud/store"
)

// TestPersistLandsAfterAFailedWrite: a bookkeeping write whose first attempt really fails (it
// runs with the caller's context, already cancelled, as a cancelled job's would) is retried
// with a context of its own and lands; the caller's cancellation does not stop it.
func TestPersistLandsAfterAFailedWrite(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		stacks := s.Collection(store.CollStacks)
		if _, err := stacks.InsertOne(ctx, bson.M{"_id": "s1", "state": "Building", "jobId": "j1"}); err != nil {
			t.Fatal(err)
		}
		jobCtx, cancel := context.WithCancel(ctx)
		cancel() // the job was cancelled
		attempts := 0
		var firstErr error
		err := s.Persist(jobCtx, "fail stack s1", time.Minute, func(actx context.Context) error {
			attempts++
			use := actx
			if attempts == 1 {
				use = jobCtx // what the bookkeeping did before: write with the cancelled context
			}
			ok, err := s.TransitionIf(use, store.CollStacks, "s1", []string{"Building"}, bson.M{"jobId": "j1"}, bson.M{"state": "Failed"})
			if attempts == 1 {
				firstErr = err
			}
			if err == nil && !ok {
				return store.Permanent(errors.New("stack changed meanwhile"))
			}
			return err
		})
		if err != nil {
			t.Fatalf("persist: %v", err)
		}
		if firstErr == nil || !errors.Is(firstErr, context.Canceled) {
			t.Fatalf("the first attempt should have failed with the cancelled context, got %v", firstErr)
		}
		if attempts != 2 {
			t.Fatalf("%d attempts, want 2", attempts)
		}
		var got struct{ State string }
		if err := stacks.FindOne(ctx, bson.M{"_id": "s1"}).Decode(&got); err != nil || got.State != "Failed" {
			t.Fatalf("stack after persist: %+v %v", got, err)
		}
	})
}

// TestPersistStopsOnPermanentErrors: not found, wrong state and caller-marked errors are not
// retried; a transient error is retried until the time budget is spent.
func TestPersistStopsOnPermanentErrors(t *testing.T) {
	t.Parallel()
	s := backends(t)[0].open(t, store.Options{})
	ctx := ctxT(t)
	for _, perm := range []error{store.ErrNotFound, fmt.Errorf("finish job: %w", store.ErrState), store.Permanent(errors.New("no"))} {
		n := 0
		err := s.Persist(ctx, "x", time.Minute, func(context.Context) error { n++; return perm })
		if n != 1 || err == nil {
			t.Errorf("%v: %d attempts, err %v", perm, n, err)
		}
	}
	n := 0
	start := time.Now()
	err := s.Persist(ctx, "x", 700*time.Millisecond, func(context.Context) error { n++; return context.DeadlineExceeded })
	if err == nil || n < 2 || time.Since(start) > 5*time.Second {
		t.Errorf("transient: %d attempts in %s, err %v", n, time.Since(start), err)
	}
	// TransitionIf refuses to be told _id or state twice.
	if _, err := s.TransitionIf(ctx, store.CollStacks, "s", []string{"A"}, bson.M{"state": "B"}, bson.M{"state": "C"}); err == nil {
		t.Error("TransitionIf accepted state in match")
	}
}
