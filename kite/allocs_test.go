package kite_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/kloud-dev/kloud/kite"
)

// allocsPerRoundTrip is what one Call costs in heap allocations, both ends together (client
// encode and wait, server decode, handler, reply), over a real loopback WebSocket. Measured with
// TestAllocsPerRoundTrip (issue 25): 217 before the connection read and wrote the wire itself
// (sourcegraph/jsonrpc2's Conn), 40 after. The test fails past 120 % of it: a change that adds
// allocations to every call must say so here.
const allocsPerRoundTrip = 40

// TestAllocsPerRoundTrip fails if a call's allocations regress by more than 20 %.
func TestAllocsPerRoundTrip(t *testing.T) {
	type echo struct {
		Kite string `json:"kite"`
		Seq  uint64 `json:"seq"`
		Text string `json:"text"`
	}
	server, err := kite.New(kite.Options{Identity: kite.Identity{Name: "server"}, Authenticator: userAuth})
	if err != nil {
		t.Fatal(err)
	}
	server.Handle("test.echo", kite.Typed(func(_ context.Context, _ *kite.Request, p *echo) (any, error) {
		return p, nil
	}))
	hs := httptest.NewServer(server)
	t.Cleanup(func() { server.Close(); hs.Close() })
	client, err := kite.New(kite.Options{Identity: kite.Identity{Name: "client"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := client.Dial(t.Context(), hs.URL+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: "user:alice"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := echo{Kite: "test", Seq: 1234567, Text: "a small payload, about one query by id: 0123456789abcdef"}
	var res echo
	call := func() {
		res = echo{}
		if err := c.Call(ctx, "test.echo", &p, &res); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 { // warm the pools
		call()
	}
	got := testing.AllocsPerRun(2000, call)
	if res != p {
		t.Fatalf("echo returned %+v, want %+v", res, p)
	}
	t.Logf("%.0f allocations per round trip (recorded: %d)", got, allocsPerRoundTrip)
	if limit := float64(allocsPerRoundTrip) * 1.2; got > limit {
		t.Errorf("%.0f allocations per round trip, more than 120 %% of the recorded %d: "+
			"find the new ones (go test ./kite -run TestAllocsPerRoundTrip -memprofile) or record the new figure with its reason",
			got, allocsPerRoundTrip)
	}
}
