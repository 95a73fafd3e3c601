package kitekey_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

func TestAuthenticator(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var auth kite.Authenticator = &kitekey.Authenticator{
		Verifier: e.verifier,
		IsAdmin:  func(u string) bool { return u == "root" },
	}
	self := kite.Identity{Username: "alice", Environment: "production", Name: "klient", Version: "1",
		Region: "local", Hostname: "m1", ID: "kite-A"}
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("kite key", func(t *testing.T) {
		p, err := auth.Authenticate(ctx, self, kite.Auth{Type: kite.AuthKiteKey,
			Key: must(e.signer.KiteKey("bob", "kite-B", "http://127.0.0.1:7000/kite"))})
		if err != nil {
			t.Fatal(err)
		}
		want := kite.Principal{Username: "bob", Type: kite.AuthKiteKey, KiteID: "kite-B", TokenID: "kite-B"}
		if *p != want {
			t.Errorf("principal %+v, want %+v", *p, want)
		}
	})

	t.Run("token", func(t *testing.T) {
		p, err := auth.Authenticate(ctx, self, kite.Auth{Type: kite.AuthToken,
			Key: must(e.signer.Token("bob", "kite-A", 15*time.Minute))})
		if err != nil {
			t.Fatal(err)
		}
		if p.Username != "bob" || p.Type != kite.AuthToken || p.TokenID == "" || p.KiteID != "" ||
			!p.Expires.Equal(t0.Add(15*time.Minute)) || p.Admin {
			t.Errorf("principal %+v", *p)
		}
	})

	t.Run("token for another kite", func(t *testing.T) {
		_, err := auth.Authenticate(ctx, self, kite.Auth{Type: kite.AuthToken,
			Key: must(e.signer.Token("bob", "kite-B", 15*time.Minute))})
		mustReject(t, err, kitekey.ErrWrongAudience)
		t.Log(err)
	})

	t.Run("token to a kite without id", func(t *testing.T) {
		noID := self
		noID.ID = ""
		_, err := auth.Authenticate(ctx, noID, kite.Auth{Type: kite.AuthToken,
			Key: must(e.signer.Token("bob", "kite-A", 15*time.Minute))})
		mustReject(t, err, kitekey.ErrWrongAudience)
	})

	t.Run("session", func(t *testing.T) {
		for _, tc := range []struct {
			user        string
			admin, want bool
		}{
			{"carol", false, false},
			{"carol", true, true}, // admin claim
			{"root", false, true}, // IsAdmin
		} {
			p, err := auth.Authenticate(ctx, self, kite.Auth{Type: kite.AuthSession,
				Key: must(e.signer.Session(tc.user, tc.admin, time.Hour))})
			if err != nil {
				t.Fatal(err)
			}
			if p.Username != tc.user || p.Type != kite.AuthSession || p.Admin != tc.want || p.TokenID == "" ||
				!p.Expires.Equal(t0.Add(time.Hour)) {
				t.Errorf("%s admin=%v: principal %+v, want Admin %v", tc.user, tc.admin, *p, tc.want)
			}
		}
	})

	t.Run("kind must match the auth type", func(t *testing.T) {
		kk := must(e.signer.KiteKey("bob", "kite-A", "http://k"))
		tok := must(e.signer.Token("bob", "kite-A", time.Minute))
		sess := must(e.signer.Session("bob", true, time.Hour))
		for _, a := range []kite.Auth{
			{Type: kite.AuthToken, Key: kk},
			{Type: kite.AuthSession, Key: kk},
			{Type: kite.AuthKiteKey, Key: tok},
			{Type: kite.AuthSession, Key: tok},
			{Type: kite.AuthKiteKey, Key: sess},
			{Type: kite.AuthToken, Key: sess},
		} {
			_, err := auth.Authenticate(ctx, self, a)
			mustReject(t, err, kitekey.ErrWrongKind)
		}
	})

	t.Run("unknown type", func(t *testing.T) {
		for _, typ := range []string{"", "kloudSecret", "sessionID", "KiteKey"} {
			_, err := auth.Authenticate(ctx, self, kite.Auth{Type: typ,
				Key: must(e.signer.KiteKey("bob", "kite-A", "http://k"))})
			if !errors.Is(err, kite.ErrAuth) {
				t.Errorf("type %q: %v, want kite.ErrAuth", typ, err)
			}
		}
	})

	t.Run("empty key", func(t *testing.T) {
		_, err := auth.Authenticate(ctx, self, kite.Auth{Type: kite.AuthKiteKey})
		mustReject(t, err, kitekey.ErrMalformed)
	})

	t.Run("no verifier", func(t *testing.T) {
		if _, err := (&kitekey.Authenticator{}).Authenticate(ctx, self, kite.Auth{Type: kite.AuthKiteKey, Key: "x"}); err == nil {
			t.Error("authenticated without a verifier")
		}
	})
}
