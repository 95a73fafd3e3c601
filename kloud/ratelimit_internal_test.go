package kloud

import (
	"fmt"
	"testing"
	"time"
)

// TestRateBucketsBounded: the buckets of many users stay at most max; a bucket that has refilled
// goes first, else the fullest; a user's emptied bucket is kept while others come and go, so
// dropping buckets never gives a limited user a fresh burst early.
func TestRateBucketsBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newRateLimiter(1, 2, 3)
	l.now = func() time.Time { return now }
	take := func(key string) bool { ok, _ := l.take(key); return ok }

	// alice empties her bucket.
	if !take("alice") || !take("alice") || take("alice") {
		t.Fatal("alice: want 2 calls then a refusal")
	}
	for i := range 100 {
		now = now.Add(10 * time.Millisecond) // 1 s in all: alice gets one token back, not two
		if !take(fmt.Sprintf("user%d", i)) {
			t.Fatalf("user%d's first call refused", i)
		}
		if n := l.size(); n > 3 {
			t.Fatalf("%d buckets after %d users, want at most 3", n, i+1)
		}
	}
	if _, ok := l.buckets["alice"]; !ok {
		t.Fatal("alice's emptied bucket was dropped")
	}
	// Whatever was dropped, alice has at most the one token a second of refill gave her.
	if !take("alice") {
		t.Fatal("alice after 1 s: want one call")
	}
	if take("alice") {
		t.Fatal("alice got a fresh burst: her emptied bucket was dropped")
	}
	// Refilled buckets are dropped before any other: an hour later, all of them.
	now = now.Add(time.Hour)
	take("bob")
	take("carol")
	if _, ok := l.buckets["alice"]; ok || l.size() != 2 {
		t.Fatalf("after an hour: %d buckets (alice's kept: %v), want bob's and carol's", l.size(), ok)
	}
	if ok, wait := newRateLimiter(0, 0, 3).take("x"); !ok || wait != 0 {
		t.Fatal("no limit: want every call allowed")
	}
}
