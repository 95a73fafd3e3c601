package kontrol_test

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kontrol"
	"github.com/kloud-dev/kloud/kontrol/kontroltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func query(t *testing.T, c *kite.Conn, q kite.Identity) []kontrol.KiteInfo {
	t.Helper()
	var res kontrol.QueryResult
	if err := c.Call(t.Context(), "kontrol.query", kontrol.QueryParams{Query: q}, &res); err != nil {
		t.Fatal(err)
	}
	return res.Kites
}

func register(t *testing.T, c *kite.Conn) {
	t.Helper()
	if err := c.Call(t.Context(), "kontrol.register", kontrol.RegisterParams{}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestRegisterAndQueryBySubsets(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	a, aid := e.Dial(t.Context(), "alice", "klient")
	register(t, a)
	b, bid := e.Dial(t.Context(), "alice", "other")
	register(t, b)
	admin, _ := e.Dial(t.Context(), "admin", "cli")

	cases := []struct {
		name string
		q    kite.Identity
		want []string
	}{
		{"all", kite.Identity{}, []string{aid, bid}},
		{"by id only", kite.Identity{ID: aid}, []string{aid}},
		{"by name", kite.Identity{Name: "other"}, []string{bid}},
		{"by username+name", kite.Identity{Username: "alice", Name: "klient"}, []string{aid}},
		{"by environment", kite.Identity{Environment: "default"}, []string{aid, bid}},
		{"no match", kite.Identity{Username: "bob"}, nil},
		{"id and wrong name", kite.Identity{ID: aid, Name: "other"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := query(t, admin, tc.q)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d kites, want %d: %+v", len(got), len(tc.want), got)
			}
			ids := map[string]bool{}
			for _, g := range got {
				ids[g.Kite.ID] = true
			}
			for _, w := range tc.want {
				if !ids[w] {
					t.Fatalf("missing %s in %+v", w, got)
				}
			}
		})
	}
	// The registered identity carries the proven username and id, whatever the kite claimed.
	got := query(t, admin, kite.Identity{ID: aid})[0].Kite
	if got.Username != "alice" || got.Name != "klient" || got.Hostname == "" {
		t.Fatalf("%+v", got)
	}
}

func TestQueryShowsOnlyWhatTheCallerMayUse(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	a, _ := e.Dial(t.Context(), "alice", "klient")
	register(t, a)
	bob, _ := e.Dial(t.Context(), "bob", "cli")
	if got := query(t, bob, kite.Identity{}); len(got) != 0 {
		t.Fatalf("bob sees alice's kites: %+v", got)
	}
	var res kontrol.GetTokenResult
	err := bob.Call(t.Context(), "kontrol.getToken", kontrol.GetTokenParams{Query: kite.Identity{Username: "alice"}}, &res)
	if !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("bob got a token for alice's kite: %v", err)
	}
}

func TestRegisterNeedsKiteKey(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	a, aid := e.Dial(t.Context(), "alice", "klient")
	register(t, a)
	// A token for kontrol itself is a valid credential to talk to kontrol, but not to register.
	tok, err := e.Kontrol.Signer().Token("alice", e.Kite.Identity().ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := kite.New(kite.Options{Identity: kite.Identity{Name: "x"}})
	defer k.Close()
	c, err := k.Dial(t.Context(), e.URL(), kite.Auth{Type: kite.AuthToken, Key: tok})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Call(t.Context(), "kontrol.register", kontrol.RegisterParams{}, nil)
	if !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("register with a token: %v", err)
	}
	_ = aid
}

func TestGetToken(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	a, aid := e.Dial(t.Context(), "alice", "klient")
	register(t, a)
	b, _ := e.Dial(t.Context(), "alice", "klient")
	register(t, b)
	alice, _ := e.Dial(t.Context(), "alice", "cli")

	var res kontrol.GetTokenResult
	if err := alice.Call(t.Context(), "kontrol.getToken", kontrol.GetTokenParams{Query: kite.Identity{ID: aid}}, &res); err != nil {
		t.Fatal(err)
	}
	claims, err := e.Kontrol.Verifier().Token(t.Context(), res.Token, aid)
	if err != nil {
		t.Fatal(err)
	}
	if claims.Subject != "alice" || len(claims.Audience) != 1 || claims.Audience[0] != aid {
		t.Fatalf("%+v", claims)
	}
	if ttl := claims.ExpiresAt.Sub(claims.IssuedAt.Time); ttl > time.Hour {
		t.Fatalf("token lives %s", ttl)
	}
	err = alice.Call(t.Context(), "kontrol.getToken", kontrol.GetTokenParams{Query: kite.Identity{Name: "klient"}}, &res)
	if !errors.Is(err, kite.ErrConflict) {
		t.Fatalf("two matches: %v", err)
	}
	err = alice.Call(t.Context(), "kontrol.getToken", kontrol.GetTokenParams{Query: kite.Identity{ID: "nope"}}, &res)
	if !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("no match: %v", err)
	}
	err = alice.Call(t.Context(), "kontrol.getToken", kontrol.GetTokenParams{}, &res)
	if !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("empty query: %v", err)
	}
}

func TestWatch(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	admin, _ := e.Dial(t.Context(), "admin", "cli")
	var res kontrol.QueryResult
	if err := admin.Call(t.Context(), "kontrol.query", kontrol.QueryParams{Query: kite.Identity{Name: "klient"}, Watch: true}, &res); err != nil {
		t.Fatal(err)
	}
	sub := admin.Subscribe(res.Subscription)
	defer sub.Close()
	other, _ := e.Dial(t.Context(), "alice", "not-klient")
	register(t, other) // does not match the watch
	a, aid := e.Dial(t.Context(), "alice", "klient")
	register(t, a)
	next := func() kontrol.Event {
		ev, err := sub.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var out kontrol.Event
		if err := json.Unmarshal(ev.Data, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if ev := next(); ev.Action != "register" || ev.Kite.Kite.ID != aid {
		t.Fatalf("%+v", ev)
	}
	a.Close(nil)
	if ev := next(); ev.Action != "deregister" || ev.Kite.Kite.ID != aid {
		t.Fatalf("%+v", ev)
	}
}

func TestKeyRotationAndRevocation(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	oldKey, oldID := e.KiteKey("alice")
	admin, _ := e.Dial(t.Context(), "admin", "cli")
	var keys kontrol.KeysResult
	if err := admin.Call(t.Context(), "kontrol.rotateKey", nil, &keys); err != nil {
		t.Fatal(err)
	}
	if len(keys.Keys) != 2 {
		t.Fatalf("after rotation want 2 verifying keys, got %+v", keys)
	}
	newKey, _ := e.KiteKey("alice")
	if h1, h2 := kid(t, oldKey), kid(t, newKey); h1 == h2 || h2 != keys.Current {
		t.Fatalf("new key not signed by the current key: %s %s %s", h1, h2, keys.Current)
	}
	dial := func(key string) (*kite.Conn, error) {
		k, _ := kite.New(kite.Options{Identity: kite.Identity{Name: "klient"}})
		t.Cleanup(func() { k.Close() })
		return k.Dial(t.Context(), e.URL(), kite.Auth{Type: kite.AuthKiteKey, Key: key})
	}
	if _, err := dial(oldKey); err != nil {
		t.Fatalf("old key must verify until retired: %v", err)
	}
	if err := admin.Call(t.Context(), "kontrol.retireKey", kontrol.RetireKeyParams{KID: kid(t, oldKey)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(oldKey); !errors.Is(err, kite.ErrAuth) {
		t.Fatalf("retired key still verifies: %v", err)
	}

	c, err := dial(newKey)
	if err != nil {
		t.Fatal(err)
	}
	register(t, c)
	claims, _ := kitekey.ParseUnverified(newKey)
	if err := admin.Call(t.Context(), "kontrol.revoke", kontrol.RevokeParams{JTI: claims.ID, Reason: "test"}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("revoked kite still connected")
	}
	if _, err := dial(newKey); !errors.Is(err, kite.ErrAuth) {
		t.Fatalf("revoked key still accepted: %v", err)
	}
	alice, _ := e.Dial(t.Context(), "alice", "cli")
	if err := alice.Call(t.Context(), "kontrol.revoke", kontrol.RevokeParams{JTI: oldID}, nil); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("non-admin revoke: %v", err)
	}
}

func kid(t *testing.T, jwt string) string {
	t.Helper()
	var h struct{ Kid string }
	parts := splitJWT(jwt)
	if err := json.Unmarshal(parts, &h); err != nil {
		t.Fatal(err)
	}
	return h.Kid
}

func splitJWT(s string) []byte {
	for i := range s {
		if s[i] == '.' {
			b, _ := decodeSegment(s[:i])
			return b
		}
	}
	return nil
}

// klient runs the real klient binary registered with e under username.
func klient(t *testing.T, e *kontroltest.Env, username string) (*exec.Cmd, string) {
	t.Helper()
	bin := testutil.BuildBinary(t, "./cmd/klient")
	path, id := e.KeyFile(username)
	return testutil.StartProcess(t, bin, "--kite-key", path), id
}

func waitEvent(t *testing.T, sub *kite.Subscription, action, id string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("waiting %s for %s of %s: %v", within, action, id, err)
		}
		var out kontrol.Event
		json.Unmarshal(ev.Data, &out)
		if out.Action == action && out.Kite.Kite.ID == id {
			return time.Since(start)
		}
	}
}

func watchAll(t *testing.T, e *kontroltest.Env) *kite.Subscription {
	t.Helper()
	admin, _ := e.Dial(t.Context(), "admin", "cli")
	var res kontrol.QueryResult
	if err := admin.Call(t.Context(), "kontrol.query", kontrol.QueryParams{Watch: true}, &res); err != nil {
		t.Fatal(err)
	}
	return admin.Subscribe(res.Subscription)
}

func TestPresenceKilledKlientIsGoneAtOnce(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	sub := watchAll(t, e)
	cmd, id := klient(t, e, "alice")
	waitEvent(t, sub, "register", id, 30*time.Second)
	cmd.Process.Signal(syscall.SIGKILL)
	d := waitEvent(t, sub, "deregister", id, time.Second)
	t.Logf("SIGKILLed klient gone from kontrol after %s", d)
	if len(e.Kontrol.Lookup(kite.Identity{ID: id})) != 0 {
		t.Fatal("still in the registry")
	}
}

func TestPresenceStoppedKlientIsDroppedByHeartbeat(t *testing.T) {
	iv, to := 200*time.Millisecond, 300*time.Millisecond
	e := kontroltest.Start(t, kontroltest.Options{PingInterval: iv, PingTimeout: to})
	sub := watchAll(t, e)
	cmd, id := klient(t, e, "alice")
	waitEvent(t, sub, "register", id, 30*time.Second)
	cmd.Process.Signal(syscall.SIGSTOP)
	d := waitEvent(t, sub, "deregister", id, iv+to+2*time.Second)
	t.Logf("SIGSTOPped klient dropped after %s (heartbeat %s + timeout %s)", d, iv, to)
	cmd.Process.Signal(syscall.SIGCONT)
	waitEvent(t, sub, "register", id, 30*time.Second) // it notices and registers again
}

func TestKontrolRestartEveryKlientComesBack(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	var ids []string
	for range 3 {
		_, id := klient(t, e, "alice")
		ids = append(ids, id)
	}
	all := func() bool {
		for _, id := range ids {
			if len(e.Kontrol.Lookup(kite.Identity{ID: id})) == 0 {
				return false
			}
		}
		return true
	}
	testutil.Eventually(t, 30*time.Second, all, "klients did not register")
	e.Restart()
	testutil.Eventually(t, 60*time.Second, all, "klients did not come back after the restart")
}
