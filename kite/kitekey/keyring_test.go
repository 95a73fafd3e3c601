package kitekey_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

func TestGenerateKey(t *testing.T) {
	k, err := kitekey.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if k.ID != kitekey.KeyID(k.Public) || len(k.ID) != 16 {
		t.Errorf("kid %q, want the 16-character KeyID of the public key", k.ID)
	}
	pub, err := k.JWK().Ed25519()
	if err != nil || !pub.Equal(k.Public) {
		t.Errorf("JWK round trip: %v, %x", err, pub)
	}
	bad := k.JWK()
	bad.ID = "AAAAAAAAAAAAAAAA"
	if _, err := bad.Ed25519(); err == nil {
		t.Error("a JWK whose kid does not match its key decoded")
	}
	bad = k.JWK()
	bad.Alg = "RS256"
	if _, err := bad.Ed25519(); err == nil {
		t.Error("a JWK with alg RS256 decoded as Ed25519")
	}
}

func TestKeyringRotation(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	old := e.ring.Current()
	oldTok, err := e.signer.Token("alice", "kite-A", 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	e.clock.Add(time.Minute)
	nk, err := e.ring.Rotate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cur := e.ring.Current(); cur.ID != nk.ID || cur.ID == old.ID {
		t.Fatalf("current key %q after rotation, want the new key %q", cur.ID, nk.ID)
	}
	if got := len(e.ring.Public()); got != 2 {
		t.Fatalf("%d public keys after rotation, want 2", got)
	}
	newTok, err := e.signer.Token("alice", "kite-A", 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if kid := kidOf(t, newTok); kid != nk.ID {
		t.Fatalf("new token signed by %q, want the new key %q", kid, nk.ID)
	}
	for name, tok := range map[string]string{"old": oldTok, "new": newTok} {
		if _, err := e.verifier.Token(ctx, tok, "kite-A"); err != nil {
			t.Errorf("%s token after rotation: %v", name, err)
		}
	}

	if err := e.ring.Retire(ctx, nk.ID); !errors.Is(err, kite.ErrState) {
		t.Errorf("retiring the current key: %v, want kite.ErrState", err)
	}
	if err := e.ring.Retire(ctx, "no-such-kid"); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("retiring an unknown key: %v, want kite.ErrNotFound", err)
	}
	if err := e.ring.Retire(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.ring.Retire(ctx, old.ID); err != nil {
		t.Errorf("retiring twice: %v", err)
	}
	_, err = e.verifier.Token(ctx, oldTok, "kite-A")
	mustReject(t, err, kitekey.ErrKeyRetired)
	mustReject(t, err, kitekey.ErrUnknownKey)
	t.Logf("old token after retirement: %v", err)
	if _, err := e.verifier.Token(ctx, newTok, "kite-A"); err != nil {
		t.Errorf("new token after retiring the old key: %v", err)
	}
	if pubs := e.ring.Public(); len(pubs) != 1 || pubs[0].ID != nk.ID {
		t.Errorf("public keys after retirement: %+v, want only %q", pubs, nk.ID)
	}
	if old.Retired() {
		t.Error("Retire modified a KeyPair handed out earlier")
	}
}

func TestFileKeyringPersists(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "keys.json")
	ring, err := kitekey.LoadOrCreateFileKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	first := ring.Current()
	signer := &kitekey.Signer{Current: ring.Current, Issuer: issuer}
	kiteKey, err := signer.KiteKey("alice", "kite-1", "http://127.0.0.1:7000/kite")
	if err != nil {
		t.Fatal(err)
	}
	second, err := ring.Rotate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	third, err := ring.Rotate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ring.Retire(ctx, second.ID); err != nil {
		t.Fatal(err)
	}

	for p, want := range map[string]os.FileMode{path: 0o600, dir: 0o700} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s has mode %04o, want %04o", p, st.Mode().Perm(), want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("data dir holds %d entries, want only the keyring (no temp files)", len(ents))
	}

	again, err := kitekey.LoadOrCreateFileKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	if again.Current().ID != third.ID {
		t.Errorf("current after reload %q, want %q", again.Current().ID, third.ID)
	}
	if !again.Current().Private.Equal(third.Private) {
		t.Error("private key changed across reload")
	}
	var ids []string
	for _, p := range again.Public() {
		ids = append(ids, p.ID)
	}
	if len(ids) != 2 || ids[0] != first.ID || ids[1] != third.ID {
		t.Errorf("public keys after reload %q, want [%q %q] (the retired one left out)", ids, first.ID, third.ID)
	}
	v := &kitekey.Verifier{Keys: again, Issuer: issuer}
	if _, err := v.KiteKey(ctx, kiteKey); err != nil {
		t.Errorf("kite key signed before the reload: %v", err)
	}
	_, err = again.PublicKey(ctx, second.ID)
	mustReject(t, err, kitekey.ErrKeyRetired)

	// The file holds what the doc says, private seeds included.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Version int `json:"version"`
		Keys    []struct {
			Kid, Kty, Alg, Crv, X, D string
			RetiredAt                *time.Time
		} `json:"keys"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if f.Version != 1 || len(f.Keys) != 3 || f.Keys[1].RetiredAt == nil || f.Keys[0].D == "" || f.Keys[0].Kty != "OKP" {
		t.Errorf("unexpected keyring file:\n%s", b)
	}
}

func TestFileKeyringRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	if _, err := kitekey.LoadOrCreateFileKeyring(path); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := kitekey.LoadOrCreateFileKeyring(path); err == nil {
		t.Error("loaded a keyring file that others can read")
	} else {
		t.Log(err)
	}

	other, err := kitekey.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	// edit returns the good file with its first key's field set to v.
	edit := func(field, v string) string {
		var f map[string]any
		if err := json.Unmarshal(good, &f); err != nil {
			t.Fatal(err)
		}
		f["keys"].([]any)[0].(map[string]any)[field] = v
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for name, content := range map[string]string{
		"empty":           "",
		"truncated":       string(good[:len(good)/2]),
		"version 2":       `{"version":2,"keys":[]}`,
		"short seed":      edit("d", "AAAA"),
		"other seed":      edit("d", base64.RawURLEncoding.EncodeToString(other.Private.Seed())),
		"kid of another":  edit("kid", other.ID),
		"alg RS256":       edit("alg", "RS256"),
		"x not base64url": edit("x", "not base64!"),
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := kitekey.LoadOrCreateFileKeyring(path); err == nil {
			t.Errorf("%s: loaded a broken keyring file", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
		if b, _ := os.ReadFile(path); string(b) != content {
			t.Errorf("%s: the broken file was replaced", name)
		}
	}
}

// TestKeyringReplicas is two kontrol replicas on one store: a key rotated in by one verifies on
// the other after a reload triggered by the unknown kid, and reloads are rate limited.
func TestKeyringReplicas(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	path := filepath.Join(t.TempDir(), "keys.json")
	a, err := kitekey.NewKeyring(ctx, kitekey.KeyringOptions{Store: &kitekey.FileStore{Path: path}, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	b, err := kitekey.NewKeyring(ctx, kitekey.KeyringOptions{Store: &kitekey.FileStore{Path: path}, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	if a.Current().ID != b.Current().ID {
		t.Fatal("second replica created its own key instead of loading the first one's")
	}
	nk, err := a.Rotate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// b loaded at t0: within MinRefresh it does not reload.
	_, err = b.PublicKey(ctx, nk.ID)
	mustReject(t, err, kitekey.ErrUnknownKey)
	c.Add(10 * time.Second)
	if _, err := b.PublicKey(ctx, nk.ID); err != nil {
		t.Fatalf("replica b after MinRefresh: %v", err)
	}
	if b.Current().ID != nk.ID {
		t.Error("replica b's current key did not follow the reload")
	}
}
