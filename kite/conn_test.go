package kite_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
)

// TestCallTimeoutWithoutDeadline: a call whose ctx has no deadline ends at CallTimeout (the
// connection's one call timer, not a context per call), the peer's handler is cancelled, and
// calls answered in time on the same connection are not disturbed — before, during and after.
func TestCallTimeoutWithoutDeadline(t *testing.T) {
	e := newServer(t, nil)
	cancelled := make(chan struct{})
	var blocked atomic.Int32
	e.server.HandleFunc("block", func(ctx context.Context, _ *kite.Request) (any, error) {
		if blocked.Add(1) == 1 {
			defer close(cancelled)
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	e.server.HandleFunc("echo", func(_ context.Context, r *kite.Request) (any, error) { return r.Params, nil })
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "client"}, CallTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	c, err := k.Dial(t.Context(), e.url, kite.Auth{Type: kite.AuthKiteKey, Key: "user:alice"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	start := time.Now()
	go func() { done <- c.Call(context.Background(), "block", nil, nil) }()
	time.Sleep(100 * time.Millisecond)
	go func() { done <- c.Call(context.Background(), "block", nil, nil) }() // a later deadline
	for i := 0; time.Since(start) < 200*time.Millisecond; i++ {
		var got []int
		if err := c.Call(context.Background(), "echo", []int{i}, &got); err != nil || len(got) != 1 || got[0] != i {
			t.Fatalf("echo %d while calls wait: %v %v", i, got, err)
		}
	}
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, kite.ErrTimeout) {
				t.Fatalf("want ErrTimeout, got %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a call without deadline did not end at CallTimeout")
		}
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("the calls ended after %s, before CallTimeout", d)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("server handler was not cancelled by kite.cancel")
	}
	var got []string
	if err := c.Call(context.Background(), "echo", []string{"after"}, &got); err != nil || len(got) != 1 || got[0] != "after" {
		t.Fatalf("echo after the timeouts: %q %v", got, err)
	}
}
