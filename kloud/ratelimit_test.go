package kloud_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
)

// TestRateLimitPerUser: with a bucket of 5 calls that refills once in 1000 s, alice's sixth call
// is refused with -32007 saying when to retry (data: retryAfterMs), on a new connection as well
// (the bucket is the user's); bob, and the administrator, are not; a kloud without a rate limit
// (kloudtest's default) never refuses.
func TestRateLimitPerUser(t *testing.T) {
	t.Parallel()
	const burst = 5
	e := kloudtest.Start(t, kloudtest.Options{Limits: kloud.Limits{RateLimit: 0.001, RateBurst: burst}})
	ctx := t.Context()
	admin := e.Client(kloud.Admin)
	for _, u := range []string{"alice", "bob"} {
		if _, err := admin.UserAdd(ctx, api.UserAddParams{Username: u, Team: model.DefaultTeam}); err != nil {
			t.Fatal(err)
		}
	}
	alice, bob := e.Client("alice"), e.Client("bob")
	for i := range burst {
		if _, err := alice.Version(ctx); err != nil {
			t.Fatalf("alice's call %d of her burst of %d: %v", i+1, burst, err)
		}
	}
	refused := func(what string, err error) {
		t.Helper()
		var ke *kite.Error
		if !errors.Is(err, kite.ErrRateLimited) || !errors.As(err, &ke) || ke.Type() != "rateLimited" {
			t.Fatalf("%s: %v, want -32007 rateLimited", what, err)
		}
		if !strings.HasPrefix(ke.Message, "rate limited: retry in ") || !strings.Contains(ke.Message, "--rate-limit") {
			t.Errorf("%s: message %q", what, ke.Message)
		}
		d, _ := ke.Data.Details.(map[string]any)
		if ms, _ := d["retryAfterMs"].(float64); ms <= 0 {
			t.Errorf("%s: data %+v has no retryAfterMs", what, ke.Data)
		}
		t.Logf("%s: %v", what, err)
	}
	_, err := alice.Version(ctx)
	refused("alice's call after her burst", err)
	_, err = alice.StackList(ctx, api.StackListParams{})
	refused("alice's stack.list after her burst", err)
	_, err = e.Client("alice").Version(ctx)
	refused("alice's call on a new connection", err)
	for i := range burst {
		if _, err := bob.Version(ctx); err != nil {
			t.Fatalf("bob's call %d while alice is limited: %v", i+1, err)
		}
	}
	if _, err := admin.UserList(ctx); err != nil {
		t.Fatalf("the administrator while alice is limited: %v", err)
	}

	free := kloudtest.Start(t, kloudtest.Options{})
	c := free.Client(kloud.Admin)
	for i := range 3 * burst {
		if _, err := c.Version(ctx); err != nil {
			t.Fatalf("call %d without a rate limit: %v", i+1, err)
		}
	}
}
