package kitekey_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite/kitekey"
)

// TestSignatureCacheKeepsEveryOtherCheck: once a credential's signature verified (and is
// remembered), what changes afterwards still refuses it — revocation, expiry, and any edit of
// its text, including its claims under the remembered signature.
func TestSignatureCacheKeepsEveryOtherCheck(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	f := forger{t, e}
	var revoked atomic.Bool
	e.verifier.Revoked = kitekey.RevokerFunc(func(_ context.Context, jti string) (bool, error) {
		return revoked.Load() && jti == "kite-A", nil
	})

	key := f.kiteKey(nil)
	for i := range 3 { // the first verifies the signature, the others find it remembered
		if _, err := e.verifier.KiteKey(ctx, key); err != nil {
			t.Fatalf("verification %d: %v", i, err)
		}
	}

	// The same signature over other claims (sub bob instead of alice): a cache keyed by jti or
	// signature alone would let it through.
	parts := strings.Split(key, ".")
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(b, &claims); err != nil {
		t.Fatal(err)
	}
	claims["sub"] = "bob"
	nb, _ := json.Marshal(claims)
	forged := parts[0] + "." + base64.RawURLEncoding.EncodeToString(nb) + "." + parts[2]
	_, err = e.verifier.KiteKey(ctx, forged)
	mustReject(t, err, kitekey.ErrBadSignature)

	revoked.Store(true)
	_, err = e.verifier.KiteKey(ctx, key)
	mustReject(t, err, kitekey.ErrRevoked)
	revoked.Store(false)
	if _, err := e.verifier.KiteKey(ctx, key); err != nil {
		t.Fatalf("after the revocation was lifted: %v", err)
	}

	tok := f.token(nil) // exp now+30m
	if _, err := e.verifier.Token(ctx, tok, "kite-A"); err != nil {
		t.Fatal(err)
	}
	e.clock.Add(31 * time.Minute)
	_, err = e.verifier.Token(ctx, tok, "kite-A")
	mustReject(t, err, kitekey.ErrExpired)
}

// BenchmarkVerifyKiteKey: a kite key verified again (the signature remembered) against one
// whose signature must be checked each time (a fresh verifier per call).
func BenchmarkVerifyKiteKey(b *testing.B) {
	ctx := context.Background()
	ring, err := kitekey.LoadOrCreateFileKeyring(filepath.Join(b.TempDir(), "keys.json"))
	if err != nil {
		b.Fatal(err)
	}
	key, err := (&kitekey.Signer{Current: ring.Current, Issuer: issuer}).KiteKey("alice", "kite-A", "http://127.0.0.1:7000/kite")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("remembered", func(b *testing.B) {
		v := &kitekey.Verifier{Keys: ring, Issuer: issuer}
		for b.Loop() {
			if _, err := v.KiteKey(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			v := &kitekey.Verifier{Keys: ring, Issuer: issuer}
			if _, err := v.KiteKey(ctx, key); err != nil {
				b.Fatal(err)
			}
		}
	})
}
