// Package storetest opens real kloud stores for other packages' tests: an embedded FerretDB in
// a temporary directory, closed when the test ends. Start with [New].
package storetest

import (
	"context"
	"testing"
	"time"

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
