package kitekey_test

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

// fuzzFixture is a verifier on a key derived from a fixed seed at a fixed time, and the only
// credentials that may verify: a kite key, a token for kite-A and a session, all deterministic
// (Ed25519 signatures are), so the committed corpus holds them too.
type fuzzFixture struct {
	v                       *kitekey.Verifier
	kiteKey, token, session string
	seeds                   []string
}

func newFuzzFixture(t testing.TB) *fuzzFixture {
	seed := sha256.Sum256([]byte("kitekey FuzzVerify"))
	priv := ed25519.NewKeyFromSeed(seed[:])
	pub := priv.Public().(ed25519.PublicKey)
	kid := kitekey.KeyID(pub)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	n := now.Unix()
	keys := kitekey.KeySourceFunc(func(_ context.Context, k string) (ed25519.PublicKey, error) {
		if k == kid {
			return pub, nil
		}
		return nil, fmt.Errorf("%w %q", kitekey.ErrUnknownKey, k)
	})
	fx := &fuzzFixture{v: &kitekey.Verifier{Keys: keys, Issuer: issuer, Now: func() time.Time { return now }}}

	hdr := map[string]any{"alg": "EdDSA", "typ": "JWT", "kid": kid}
	sign := edSign(priv)
	fx.kiteKey = rawJWT(t, hdr, map[string]any{"iss": issuer, "sub": "alice", "jti": "kite-A", "iat": n,
		"kind": "kiteKey", "kontrolURL": "http://127.0.0.1:7000/kite"}, sign)
	tokenClaims := func() map[string]any {
		return map[string]any{"iss": issuer, "sub": "alice", "aud": []string{"kite-A"}, "iat": n, "nbf": n,
			"exp": n + 1800, "jti": "tok-1", "kind": "token"}
	}
	fx.token = rawJWT(t, hdr, tokenClaims(), sign)
	fx.session = rawJWT(t, hdr, map[string]any{"iss": issuer, "sub": "alice", "iat": n, "nbf": n,
		"exp": n + 3600, "jti": "sess-1", "kind": "session", "admin": true}, sign)

	with := func(m map[string]any, k string, v any) map[string]any {
		c := map[string]any{}
		for kk, vv := range m {
			c[kk] = vv
		}
		c[k] = v
		return c
	}
	hs := func(s string) []byte {
		m := hmac.New(sha256.New, pub)
		m.Write([]byte(s))
		return m.Sum(nil)
	}
	p := strings.Split(fx.token, ".")
	fx.seeds = []string{
		fx.kiteKey, fx.token, fx.session,
		rawJWT(t, with(hdr, "alg", "none"), tokenClaims(), nil),
		rawJWT(t, with(hdr, "alg", "HS256"), tokenClaims(), hs),
		rawJWT(t, with(hdr, "alg", "RS256"), tokenClaims(), sign),
		rawJWT(t, with(hdr, "kid", "other"), tokenClaims(), sign),
		rawJWT(t, hdr, with(tokenClaims(), "aud", []string{"kite-A", "kite-B"}), sign),
		rawJWT(t, hdr, with(tokenClaims(), "exp", n+7200), sign),
		rawJWT(t, hdr, with(tokenClaims(), "kind", "kiteKey"), sign),
		rawJWT(t, hdr, with(tokenClaims(), "exp", "soon"), sign),
		rawJWT(t, with(hdr, "crit", []string{"b64"}), tokenClaims(), sign),
		p[0] + "." + p[1] + ".",
		p[0] + "." + p[1] + "." + p[2] + "\n",
		p[0] + "." + p[1] + "." + p[2][:40],
		p[0] + ".." + p[2],
		"", ".", "..", "...", "a.b.c", "eyJ9.eyJ9.eyJ9", "e30.e30.e30", "bnVsbA.bnVsbA.AA",
		"W10.W10.AA", "IiI.IiI.AA", "eyJhbGciOiJFZERTQSIsImtpZCI6bnVsbH0.e30.AA",
	}
	return fx
}

// check verifies raw as every kind: it must not panic, must verify only if it is the one
// credential of that kind, and must otherwise fail with an authentication error.
func (fx *fuzzFixture) check(t *testing.T, raw string) {
	ctx := context.Background()
	results := []struct {
		kind string
		ok   string
		err  error
	}{
		{"kite key", fx.kiteKey, second2(fx.v.KiteKey(ctx, raw))},
		{"token", fx.token, second2(fx.v.Token(ctx, raw, "kite-A"))},
		{"session", fx.session, second2(fx.v.Session(ctx, raw))},
	}
	for _, r := range results {
		switch {
		case r.err == nil && raw != r.ok:
			t.Fatalf("%q verified as a %s", raw, r.kind)
		case r.err != nil && raw == r.ok:
			t.Fatalf("the fixture's %s was rejected: %v", r.kind, r.err)
		case r.err != nil && !errors.Is(r.err, kite.ErrAuth):
			t.Fatalf("%q as a %s: %v does not wrap kite.ErrAuth", raw, r.kind, r.err)
		}
	}
	c, err := kitekey.ParseUnverified(raw)
	if err == nil && (c.Kind != kitekey.KindKiteKey || c.Subject == "" || c.ID == "") {
		t.Fatalf("ParseUnverified(%q) returned incomplete claims %+v", raw, c)
	}
}

func second2[T any](_ T, err error) error { return err }

// FuzzVerify feeds arbitrary strings to the verifier (and ParseUnverified): nothing may panic,
// nothing but the fixture's three credentials may verify, and every rejection is an
// authentication error. Seeds: fuzzFixture.seeds and testdata/fuzz/FuzzVerify.
//
//	go test ./kite/kitekey -run '^$' -fuzz FuzzVerify -fuzztime 60s
func FuzzVerify(f *testing.F) {
	fx := newFuzzFixture(f)
	for _, s := range fx.seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) { fx.check(t, raw) })
}
