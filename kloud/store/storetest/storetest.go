// Package storetest opens real kloud stores for other packages' tests: an embedded FerretDB in
// a temporary directory, closed when the test ends. Start with [New].
package storetest

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/store"
)

// New opens an embedded store in t.TempDir(), logging to t.Log, and closes it in t.Cleanup.
func New(t testing.TB) *store.Store {
	t.Helper()
	return Open(t, store.Options{})
}

// Open is New with options: an empty DataDir becomes t.TempDir() and a nil Logger logs to
// t.Log. Set MongoURL to test against a MongoDB instead of the embedded store.
func Open(t testing.TB, opts store.Options) *store.Store {
	t.Helper()
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = testutil.Logger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := store.Open(ctx, opts)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s
}

// Raw returns document id of collection coll as stored (BSON), for a test that checks what is
// at rest (e.g. that no secret is in it). A missing document fails the test.
func Raw(t testing.TB, s *store.Store, coll, id string) bson.Raw {
	t.Helper()
	var raw bson.Raw
	if err := s.Collection(coll).FindOne(context.Background(), bson.M{"_id": id}).Decode(&raw); err != nil {
		t.Fatalf("read %s/%s: %v", coll, id, err)
	}
	return raw
}

// SetFields sets fields (dotted paths allowed) of document id of collection coll directly,
// bypassing the repositories: for a test that simulates a record left by an older kloud or by
// a process that died (an expired job lease, files stored before a policy existed). A missing
// document fails the test.
func SetFields(t testing.TB, s *store.Store, coll, id string, fields map[string]any) {
	t.Helper()
	res, err := s.Collection(coll).UpdateOne(context.Background(), bson.M{"_id": id}, bson.M{"$set": bson.M(fields)})
	if err != nil {
		t.Fatalf("set fields of %s/%s: %v", coll, id, err)
	}
	if res.MatchedCount == 0 {
		t.Fatalf("set fields of %s/%s: no such document", coll, id)
	}
}
