package kitekey_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite/kitekey"
)

// forger mints credentials the way Signer would not: any header, any claims, signed by the
// keyring's current key unless told otherwise.
type forger struct {
	t *testing.T
	e *env
}

func (f forger) header() map[string]any {
	return map[string]any{"alg": "EdDSA", "typ": "JWT", "kid": f.e.ring.Current().ID}
}

func (f forger) tokenClaims() map[string]any {
	now := f.e.clock.Now().Unix()
	return map[string]any{"iss": issuer, "sub": "alice", "aud": []string{"kite-A"}, "iat": now, "nbf": now,
		"exp": now + 1800, "jti": "tok-1", "kind": "token"}
}

func (f forger) kiteKeyClaims() map[string]any {
	return map[string]any{"iss": issuer, "sub": "alice", "jti": "kite-A", "iat": f.e.clock.Now().Unix(),
		"kind": "kiteKey", "kontrolURL": "http://127.0.0.1:7000/kite"}
}

func (f forger) sessionClaims() map[string]any {
	now := f.e.clock.Now().Unix()
	return map[string]any{"iss": issuer, "sub": "alice", "iat": now, "nbf": now, "exp": now + 3600,
		"jti": "sess-1", "kind": "session"}
}

// sign signs claims with the current key after applying edits (nil value: delete the claim).
func (f forger) sign(claims map[string]any, edits map[string]any) string {
	for k, v := range edits {
		if v == nil {
			delete(claims, k)
		} else {
			claims[k] = v
		}
	}
	return rawJWT(f.t, f.header(), claims, edSign(f.e.ring.Current().Private))
}

func (f forger) token(edits map[string]any) string   { return f.sign(f.tokenClaims(), edits) }
func (f forger) kiteKey(edits map[string]any) string { return f.sign(f.kiteKeyClaims(), edits) }
func (f forger) session(edits map[string]any) string { return f.sign(f.sessionClaims(), edits) }

// TestVerifyMatrix is the full table of credentials the verifier must reject, each for its own
// reason, next to the near misses it must accept.
func TestVerifyMatrix(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	f := forger{t, e}
	now := e.clock.Now().Unix()
	other, err := kitekey.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	cur := e.ring.Current()
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	withHeader := func(h map[string]any, claims map[string]any, sign func(string) []byte) string {
		return rawJWT(t, h, claims, sign)
	}
	hdr := func(edits map[string]any) map[string]any {
		h := f.header()
		for k, v := range edits {
			if v == nil {
				delete(h, k)
			} else {
				h[k] = v
			}
		}
		return h
	}
	good := must(e.signer.Token("alice", "kite-A", 30*time.Minute))
	goodParts := strings.Split(good, ".")
	evilParts := strings.Split(f.token(map[string]any{"sub": "mallory"}), ".")

	// Signed by the right key but with a different issuer, via a second signer.
	wrongIss := must((&kitekey.Signer{Key: cur, Issuer: "evil-kontrol", Now: e.clock.Now}).Token("alice", "kite-A", time.Minute))
	hmacSig := func(s string) []byte {
		m := hmac.New(sha256.New, cur.Public)
		m.Write([]byte(s))
		return m.Sum(nil)
	}
	e.verifier.Revoked = kitekey.RevokerFunc(func(_ context.Context, jti string) (bool, error) {
		return jti == "revoked-kite" || jti == "revoked-tok", nil
	})

	type check int
	const (
		asToken check = iota
		asKiteKey
		asSession
	)
	tests := []struct {
		name string
		raw  string
		as   check
		aud  string // for asToken; default kite-A
		want error  // nil: must verify
	}{
		// Accepted.
		{"signed token", good, asToken, "", nil},
		{"signed kite key", must(e.signer.KiteKey("alice", "kite-A", "http://127.0.0.1:7000/kite")), asKiteKey, "", nil},
		{"signed session", must(e.signer.Session("alice", true, 24*time.Hour)), asSession, "", nil},
		{"iat within leeway in the future", f.token(map[string]any{"iat": now + 20, "nbf": now + 20}), asToken, "", nil},
		{"expired within leeway", f.token(map[string]any{"iat": now - 1800, "nbf": now - 1800, "exp": now - 20}), asToken, "", nil},
		{"lifetime 1h plus part of the leeway", f.token(map[string]any{"exp": now + 3600 + 20}), asToken, "", nil},
		{"aud as a single string", f.token(map[string]any{"aud": "kite-A"}), asToken, "", nil},

		// Signature and key.
		{"payload swapped", goodParts[0] + "." + evilParts[1] + "." + goodParts[2], asToken, "", kitekey.ErrBadSignature},
		{"signed by another key under our kid", withHeader(f.header(), f.tokenClaims(), edSign(other.Private)), asToken, "", kitekey.ErrBadSignature},
		{"empty signature", goodParts[0] + "." + goodParts[1] + ".", asToken, "", kitekey.ErrBadSignature},
		{"signature too short", goodParts[0] + "." + goodParts[1] + "." + goodParts[2][:40], asToken, "", kitekey.ErrBadSignature},
		{"signature truncated mid-byte", good[:len(good)-5], asToken, "", kitekey.ErrMalformed}, // 81 base64 chars: never a whole number of bytes
		{"unknown kid", withHeader(hdr(map[string]any{"kid": other.ID}), f.tokenClaims(), edSign(other.Private)), asToken, "", kitekey.ErrUnknownKey},
		{"missing kid", withHeader(hdr(map[string]any{"kid": nil}), f.tokenClaims(), edSign(cur.Private)), asToken, "", kitekey.ErrUnknownKey},
		{"empty kid", withHeader(hdr(map[string]any{"kid": ""}), f.tokenClaims(), edSign(cur.Private)), asToken, "", kitekey.ErrUnknownKey},
		{"kid not a string", withHeader(hdr(map[string]any{"kid": 7}), f.tokenClaims(), edSign(cur.Private)), asToken, "", kitekey.ErrUnknownKey},

		// Algorithms.
		{"alg none, no signature", withHeader(hdr(map[string]any{"alg": "none"}), f.tokenClaims(), nil), asToken, "", kitekey.ErrAlgorithm},
		{"alg none, kite key", withHeader(hdr(map[string]any{"alg": "none"}), f.kiteKeyClaims(), nil), asKiteKey, "", kitekey.ErrAlgorithm},
		{"alg None", withHeader(hdr(map[string]any{"alg": "None"}), f.tokenClaims(), nil), asToken, "", kitekey.ErrAlgorithm},
		{"HS256 with the public key as secret", withHeader(hdr(map[string]any{"alg": "HS256"}), f.tokenClaims(), hmacSig), asToken, "", kitekey.ErrAlgorithm},
		{"RS256 header on an Ed25519 signature", withHeader(hdr(map[string]any{"alg": "RS256"}), f.tokenClaims(), edSign(cur.Private)), asToken, "", kitekey.ErrAlgorithm},
		{"ES256 header", withHeader(hdr(map[string]any{"alg": "ES256"}), f.tokenClaims(), edSign(cur.Private)), asToken, "", kitekey.ErrAlgorithm},
		{"alg missing", withHeader(hdr(map[string]any{"alg": nil}), f.tokenClaims(), edSign(cur.Private)), asToken, "", kitekey.ErrAlgorithm},
		{"alg not a string", withHeader(hdr(map[string]any{"alg": []string{"EdDSA"}}), f.tokenClaims(), edSign(cur.Private)), asToken, "", kitekey.ErrAlgorithm},

		// Time.
		{"expired", f.token(map[string]any{"iat": now - 3600, "nbf": now - 3600, "exp": now - 31}), asToken, "", kitekey.ErrExpired},
		{"expired session", f.session(map[string]any{"iat": now - 7200, "nbf": now - 7200, "exp": now - 60}), asSession, "", kitekey.ErrExpired},
		{"nbf in the future", f.token(map[string]any{"nbf": now + 300}), asToken, "", kitekey.ErrNotYetValid},
		{"iat in the future", f.token(map[string]any{"iat": now + 300, "nbf": nil, "exp": now + 900}), asToken, "", kitekey.ErrNotYetValid},
		{"kite key issued in the future", f.kiteKey(map[string]any{"iat": now + 300}), asKiteKey, "", kitekey.ErrNotYetValid},

		// Lifetime.
		{"token lives 2h", f.token(map[string]any{"exp": now + 7200}), asToken, "", kitekey.ErrLifetime},
		{"token lives 1h + 31s", f.token(map[string]any{"exp": now + 3600 + 31}), asToken, "", kitekey.ErrLifetime},
		{"token without exp", f.token(map[string]any{"exp": nil}), asToken, "", kitekey.ErrLifetime},
		{"session without exp", f.session(map[string]any{"exp": nil}), asSession, "", kitekey.ErrLifetime},
		{"session lives 31 days", f.session(map[string]any{"exp": now + 31*24*3600}), asSession, "", kitekey.ErrLifetime},

		// Audience.
		{"token for another kite", good, asToken, "kite-B", kitekey.ErrWrongAudience},
		{"aud with two entries", f.token(map[string]any{"aud": []string{"kite-A", "kite-B"}}), asToken, "", kitekey.ErrWrongAudience},
		{"aud with two entries, ours second", f.token(map[string]any{"aud": []string{"kite-B", "kite-A"}}), asToken, "", kitekey.ErrWrongAudience},
		{"aud empty list", f.token(map[string]any{"aud": []string{}}), asToken, "", kitekey.ErrWrongAudience},
		{"aud empty string", f.token(map[string]any{"aud": ""}), asToken, "", kitekey.ErrWrongAudience},
		{"aud missing", f.token(map[string]any{"aud": nil}), asToken, "", kitekey.ErrWrongAudience},
		{"root audience", f.token(map[string]any{"aud": "/"}), asToken, "", kitekey.ErrWrongAudience},
		{"user prefix audience", f.token(map[string]any{"aud": "/alice"}), asToken, "", kitekey.ErrWrongAudience},
		{"verifier given no audience", good, asToken, "-", kitekey.ErrWrongAudience},
		{"kite key with aud", f.kiteKey(map[string]any{"aud": "kite-A"}), asKiteKey, "", kitekey.ErrWrongAudience},
		{"session with aud", f.session(map[string]any{"aud": "kite-A"}), asSession, "", kitekey.ErrWrongAudience},

		// Issuer.
		{"wrong iss", wrongIss, asToken, "", kitekey.ErrWrongIssuer},
		{"missing iss", f.token(map[string]any{"iss": nil}), asToken, "", kitekey.ErrWrongIssuer},
		{"kite key with wrong iss", f.kiteKey(map[string]any{"iss": "koding"}), asKiteKey, "", kitekey.ErrWrongIssuer},

		// Kind.
		{"kite key as token", must(e.signer.KiteKey("alice", "kite-A", "http://k")), asToken, "", kitekey.ErrWrongKind},
		{"token as kite key", good, asKiteKey, "", kitekey.ErrWrongKind},
		{"session as token", f.session(map[string]any{"aud": []string{"kite-A"}}), asToken, "", kitekey.ErrWrongKind},
		{"token as session", good, asSession, "", kitekey.ErrWrongKind},
		{"kite key as session", f.kiteKey(nil), asSession, "", kitekey.ErrWrongKind},
		{"no kind", f.token(map[string]any{"kind": nil}), asToken, "", kitekey.ErrWrongKind},
		{"kind in other case", f.token(map[string]any{"kind": "Token"}), asToken, "", kitekey.ErrWrongKind},

		// Required claims.
		{"token without sub", f.token(map[string]any{"sub": nil}), asToken, "", kitekey.ErrMissingClaim},
		{"kite key without jti", f.kiteKey(map[string]any{"jti": nil}), asKiteKey, "", kitekey.ErrMissingClaim},
		{"kite key without iat", f.kiteKey(map[string]any{"iat": nil}), asKiteKey, "", kitekey.ErrMissingClaim},
		{"token without iat", f.token(map[string]any{"iat": nil}), asToken, "", kitekey.ErrMissingClaim},

		// Revocation.
		{"revoked kite key", must(e.signer.KiteKey("alice", "revoked-kite", "http://k")), asKiteKey, "", kitekey.ErrRevoked},
		{"revoked token", f.token(map[string]any{"jti": "revoked-tok"}), asToken, "", kitekey.ErrRevoked},

		// Shape.
		{"empty", "", asToken, "", kitekey.ErrMalformed},
		{"one part", "abc", asToken, "", kitekey.ErrMalformed},
		{"four parts", good + ".AAAA", asToken, "", kitekey.ErrMalformed},
		{"newline in signature", good[:len(good)-10] + "\n" + good[len(good)-10:], asToken, "", kitekey.ErrMalformed},
		{"trailing newline", good + "\n", asToken, "", kitekey.ErrMalformed},
		{"padding", good + "==", asToken, "", kitekey.ErrMalformed},
		{"too long", f.token(map[string]any{"pad": strings.Repeat("x", kitekey.MaxLen)}), asToken, "", kitekey.ErrMalformed},
		{"header not json", "bm90IGpzb24." + goodParts[1] + "." + goodParts[2], asToken, "", kitekey.ErrMalformed},
		{"claims not json", goodParts[0] + ".bm90IGpzb24." + goodParts[2], asToken, "", kitekey.ErrMalformed},
		{"crit header", withHeader(hdr(map[string]any{"crit": []string{"exp"}}), f.tokenClaims(), edSign(cur.Private)), asToken, "", kitekey.ErrMalformed},
		{"exp not a number", f.token(map[string]any{"exp": "tomorrow"}), asToken, "", kitekey.ErrMalformed},
		{"aud a number", f.token(map[string]any{"aud": 7}), asToken, "", kitekey.ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			switch tc.as {
			case asToken:
				aud := tc.aud
				switch aud {
				case "":
					aud = "kite-A"
				case "-":
					aud = ""
				}
				_, err = e.verifier.Token(ctx, tc.raw, aud)
			case asKiteKey:
				_, err = e.verifier.KiteKey(ctx, tc.raw)
			case asSession:
				_, err = e.verifier.Session(ctx, tc.raw)
			}
			if tc.want == nil {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			mustReject(t, err, tc.want)
			t.Logf("%v", err)
		})
	}
}

func TestVerifierClaims(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	raw, err := e.signer.KiteKey("alice", "kite-1", "http://127.0.0.1:7000/kite")
	if err != nil {
		t.Fatal(err)
	}
	kk, err := e.verifier.KiteKey(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	if kk.Subject != "alice" || kk.ID != "kite-1" || kk.Issuer != issuer || kk.KontrolURL != "http://127.0.0.1:7000/kite" ||
		kk.Kind != kitekey.KindKiteKey || kk.ExpiresAt != nil || !kk.IssuedAt.Equal(t0) {
		t.Errorf("kite key claims %+v", kk)
	}
	if kidOf(t, raw) != e.ring.Current().ID {
		t.Error("kite key header does not name the signing key")
	}

	raw, err = e.signer.Token("bob", "kite-1", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := e.verifier.Token(ctx, raw, "kite-1")
	if err != nil {
		t.Fatal(err)
	}
	if tc.Subject != "bob" || len(tc.Audience) != 1 || tc.Audience[0] != "kite-1" || tc.ID == "" ||
		!tc.ExpiresAt.Equal(t0.Add(10*time.Minute)) || !tc.NotBefore.Equal(t0) {
		t.Errorf("token claims %+v", tc)
	}
	raw2, err := e.signer.Token("bob", "kite-1", 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if tc2, _ := e.verifier.Token(ctx, raw2, "kite-1"); tc2 == nil || tc2.ID == tc.ID {
		t.Error("two tokens share a jti")
	}

	raw, err = e.signer.Session("carol", true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := e.verifier.Session(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Subject != "carol" || !sc.Admin || sc.ID == "" {
		t.Errorf("session claims %+v", sc)
	}

	// The clock moves past exp (and the leeway): the same token is now expired.
	e.clock.Add(10*time.Minute + kitekey.DefaultLeeway + time.Second)
	_, err = e.verifier.Token(ctx, raw2, "kite-1")
	mustReject(t, err, kitekey.ErrExpired)
	// Without leeway it expires right at exp.
	strict := *e.verifier
	strict.Leeway = -1
	strict.Now = func() time.Time { return t0.Add(10 * time.Minute) }
	_, err = strict.Token(ctx, raw2, "kite-1")
	mustReject(t, err, kitekey.ErrExpired)
}

func TestVerifierNeedsConfig(t *testing.T) {
	e := newEnv(t)
	raw, err := e.signer.Token("alice", "kite-A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]*kitekey.Verifier{
		"no keys":   {Issuer: issuer},
		"no issuer": {Keys: e.ring},
	} {
		if _, err := v.Token(context.Background(), raw, "kite-A"); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}

func TestSignerRefuses(t *testing.T) {
	e := newEnv(t)
	s := e.signer
	for name, err := range map[string]error{
		"token ttl over 1h":       second(s.Token("alice", "kite-A", time.Hour+time.Second)),
		"token ttl zero":          second(s.Token("alice", "kite-A", 0)),
		"token no audience":       second(s.Token("alice", "", time.Minute)),
		"token slash in user":     second(s.Token("a/b", "kite-A", time.Minute)),
		"session ttl negative":    second(s.Session("alice", false, -time.Second)),
		"session ttl too long":    second(s.Session("alice", false, kitekey.MaxSessionTTL+time.Second)),
		"kite key no user":        second(s.KiteKey("", "kite-A", "http://k")),
		"kite key no kite id":     second(s.KiteKey("alice", "", "http://k")),
		"kite key no kontrol":     second(s.KiteKey("alice", "kite-A", "")),
		"no key":                  second((&kitekey.Signer{Issuer: issuer}).Token("alice", "kite-A", time.Minute)),
		"no issuer":               second((&kitekey.Signer{Key: e.ring.Current()}).Token("alice", "kite-A", time.Minute)),
		"retired key":             second((&kitekey.Signer{Key: retired(e.ring.Current()), Issuer: issuer}).Token("alice", "kite-A", time.Minute)),
		"kite id longer than 256": second(s.KiteKey("alice", strings.Repeat("k", 257), "http://k")),
	} {
		if err == nil {
			t.Errorf("%s: signed", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, err := s.Token("alice", "kite-A", time.Hour); err != nil {
		t.Errorf("token for exactly 1h: %v", err)
	}
}

func second(_ string, err error) error { return err }

func retired(k *kitekey.KeyPair) *kitekey.KeyPair {
	c := *k
	c.RetiredAt = &t0
	return &c
}
