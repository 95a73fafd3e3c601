package kloud_test

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// TestRetentionSchedule: with a short interval, kloud's retention task prunes old finished jobs
// (but not the newest job of a stack that exists, nor a running job), expired revocations (not
// permanent ones) and the presence records of a replica that is gone (not its own).
func TestRetentionSchedule(t *testing.T) {
	t.Parallel()
	env := kloudtest.Start(t, kloudtest.Options{Retention: kloud.Retention{Jobs: 50 * time.Millisecond, Kites: 300 * time.Millisecond, Interval: 100 * time.Millisecond}})
	st := env.Server.Store()
	ctx := t.Context()
	js := st.Jobs()
	finished := func(target string) string {
		t.Helper()
		id, err := js.Create(ctx, store.Job{Kind: "stack.apply", Target: target, Owner: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Start(ctx, id, "elsewhere"); err != nil {
			t.Fatal(err)
		}
		if err := js.Finish(ctx, id, errors.New("done"), store.Doc{}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	stackID := store.NewID()
	if _, err := st.Collection(store.CollStacks).InsertOne(ctx, bson.M{"_id": stackID, "state": model.StackFailed, "owner": "alice"}); err != nil {
		t.Fatal(err)
	}
	gone := finished("stack/" + store.NewID()) // its stack does not exist
	olderOfStack := finished("stack/" + stackID)
	time.Sleep(5 * time.Millisecond) // createdAt orders a target's jobs
	newestOfStack := finished("stack/" + stackID)
	running, err := js.Create(ctx, store.Job{Kind: "machine.start", Target: "machine/m", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Start(ctx, running, "elsewhere"); err != nil {
		t.Fatal(err)
	}

	rv := st.Revocations()
	if err := rv.Revoke(ctx, "expired", st.Now().Add(-2*time.Hour), "test"); err != nil {
		t.Fatal(err)
	}
	if err := rv.Revoke(ctx, "forever", time.Time{}, "test"); err != nil {
		t.Fatal(err)
	}
	long := st.Now().Add(-time.Hour)
	if err := st.Kites().Upsert(ctx, store.KiteRecord{ID: "dead-replica-kite", Replica: "dead", LastSeen: long, ConnectedAt: long}); err != nil {
		t.Fatal(err)
	}
	if err := st.Kites().Upsert(ctx, store.KiteRecord{ID: "own-kite", Replica: st.InstanceID(), LastSeen: long, ConnectedAt: long}); err != nil {
		t.Fatal(err)
	}

	exists := func(id string) bool {
		_, err := js.Get(ctx, id)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		revoked, err := rv.IsRevoked(ctx, "expired")
		if err != nil {
			t.Fatal(err)
		}
		_, kerr := st.Kites().Get(ctx, "dead-replica-kite")
		if !exists(gone) && !exists(olderOfStack) && !revoked && errors.Is(kerr, store.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not pruned within 20s: job gone %v, older job of stack %v, expired revocation %v, dead kite %v",
				exists(gone), exists(olderOfStack), revoked, kerr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a few more passes
	if !exists(newestOfStack) || !exists(running) {
		t.Fatalf("pruned what should stay: newest job of the stack %v, running job %v", exists(newestOfStack), exists(running))
	}
	if ok, err := rv.IsRevoked(ctx, "forever"); err != nil || !ok {
		t.Fatalf("permanent revocation: %v %v", ok, err)
	}
	if _, err := st.Kites().Get(ctx, "own-kite"); err != nil {
		t.Fatalf("this replica's kite record: %v", err)
	}
}
