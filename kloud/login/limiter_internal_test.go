package login

import (
	"testing"
	"time"
)

func TestLoginLimiterWindow(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	l := newLoginLimiter(3, time.Minute)
	l.now = func() time.Time { return now }
	for range 3 {
		if l.blocked("k") != 0 {
			t.Fatal("blocked too early")
		}
		l.fail("k")
		now = now.Add(10 * time.Second)
	}
	// Failures at 0s, 10s, 20s; now 30s: blocked until the first one is a minute old.
	if got := l.blocked("k"); got != 30*time.Second {
		t.Fatalf("wait %v, want 30s", got)
	}
	if l.blocked("other") != 0 {
		t.Fatal("another key is blocked")
	}
	now = now.Add(30 * time.Second)
	if l.blocked("k") != 0 {
		t.Fatal("still blocked after the window")
	}
	l.fail("k")
	if l.blocked("k") == 0 {
		t.Fatal("not blocked with three failures in the window")
	}
	l.reset("k")
	if l.blocked("k") != 0 || len(l.fails) != 0 {
		t.Fatal("reset kept failures")
	}
}
