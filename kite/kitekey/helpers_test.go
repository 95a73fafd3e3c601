package kitekey_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

const issuer = "kontrol"

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// clock is a settable clock; tests move it instead of sleeping.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: t0} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// env is a kontrol's worth of key material: a file keyring in a temp dir, a signer following its
// current key and a verifier on it, all on one settable clock.
type env struct {
	clock    *clock
	ring     *kitekey.FileKeyring
	signer   *kitekey.Signer
	verifier *kitekey.Verifier
}

func newEnv(t *testing.T) *env {
	t.Helper()
	c := newClock()
	ring, err := kitekey.LoadOrCreateFileKeyring(filepath.Join(t.TempDir(), "data", "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	return &env{
		clock:    c,
		ring:     ring,
		signer:   &kitekey.Signer{Current: ring.Current, Issuer: issuer, Now: c.Now},
		verifier: &kitekey.Verifier{Keys: ring, Issuer: issuer, Now: c.Now},
	}
}

// rawJWT builds a JWT by hand: any header, any claims, any signature function (nil: no
// signature). It is how the tests forge what Signer would never produce.
func rawJWT(t testing.TB, header, claims map[string]any, sign func(signingString string) []byte) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	s := enc(header) + "." + enc(claims)
	var sig []byte
	if sign != nil {
		sig = sign(s)
	}
	return s + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func edSign(priv ed25519.PrivateKey) func(string) []byte {
	return func(s string) []byte { return ed25519.Sign(priv, []byte(s)) }
}

// mustReject checks that err is an authentication failure for the reason want.
func mustReject(t *testing.T, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted, want rejection for %q", want)
	}
	if !errors.Is(err, kite.ErrAuth) {
		t.Errorf("error %q does not wrap kite.ErrAuth", err)
	}
	if !errors.Is(err, want) {
		t.Errorf("error %q does not wrap %q", err, want)
	}
	if w := kite.ToWire(err); w.Code != kite.CodeAuth {
		t.Errorf("error %q goes on the wire as code %d, want %d", err, w.Code, kite.CodeAuth)
	}
}

// kidOf returns the kid in a JWT's header.
func kidOf(t *testing.T, raw string) string {
	t.Helper()
	seg, _, _ := strings.Cut(raw, ".")
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	return h.Kid
}
