package kitekey_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite/kitekey"
)

func TestKiteKeyFile(t *testing.T) {
	e := newEnv(t)
	key, err := e.signer.KiteKey("alice", "kite-1", "http://127.0.0.1:7000/kite")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "home", ".kite")
	path := filepath.Join(dir, "kite.key")
	if err := kitekey.WriteFile(path, key); err != nil {
		t.Fatal(err)
	}
	checkMode(t, path, 0o400)
	checkMode(t, dir, 0o700)

	got, err := kitekey.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != key {
		t.Errorf("read back %q, want %q", got, key)
	}
	c, err := kitekey.ParseUnverified(got)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject != "alice" || c.ID != "kite-1" || c.Issuer != issuer || c.KontrolURL != "http://127.0.0.1:7000/kite" {
		t.Errorf("claims %+v", c)
	}

	// Replacing the read-only file works, atomically, and leaves no temporary files.
	key2, err := e.signer.KiteKey("alice", "kite-2", "http://127.0.0.1:7000/kite")
	if err != nil {
		t.Fatal(err)
	}
	if err := kitekey.WriteFile(path, "  "+key2+"\n\n"); err != nil {
		t.Fatal(err)
	}
	checkMode(t, path, 0o400)
	if got, err := kitekey.ReadFile(path); err != nil || got != key2 {
		t.Errorf("after replace: %q, %v", got, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries in %s, want just kite.key", len(ents), dir)
	}
}

func TestKiteKeyFileErrors(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o400); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tok, err := e.signer.Token("alice", "kite-A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	_, err = kitekey.ReadFile(filepath.Join(dir, "missing.key"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "missing.key") {
		t.Errorf("missing file: %v, want fs.ErrNotExist naming the file", err)
	}
	for name, tc := range map[string]struct {
		content string
		want    error // nil: just an error mentioning the words
		words   string
	}{
		"empty":       {"", nil, "empty"},
		"blank":       {" \n\t\n", nil, "empty"},
		"not a jwt":   {"hello world\n", kitekey.ErrMalformed, "not a JWT"},
		"a token":     {tok + "\n", kitekey.ErrWrongKind, `kind "token"`},
		"alg none":    {"eyJhbGciOiJub25lIn0.eyJraW5kIjoia2l0ZUtleSJ9.", kitekey.ErrAlgorithm, "none"},
		"pem not jwt": {"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI\n-----END PRIVATE KEY-----\n", kitekey.ErrMalformed, "not a JWT"},
	} {
		p := write(strings.ReplaceAll(name, " ", "-")+".key", tc.content)
		_, err := kitekey.ReadFile(p)
		if err == nil {
			t.Errorf("%s: read as a kite key", name)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
		if !strings.Contains(err.Error(), tc.words) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %q should name the file and say %q", name, err, tc.words)
		}
		t.Logf("%s: %v", name, err)
	}

	if err := kitekey.WriteFile(filepath.Join(dir, "x.key"), tok); !errors.Is(err, kitekey.ErrWrongKind) {
		t.Errorf("writing a token as a kite key: %v", err)
	}
	if err := kitekey.WriteFile(filepath.Join(dir, "y.key"), "garbage"); err == nil {
		t.Error("wrote garbage as a kite key")
	}
	if _, err := os.Stat(filepath.Join(dir, "y.key")); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a refused write left a file behind")
	}
}

func checkMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != want {
		t.Errorf("%s has mode %04o, want %04o", path, st.Mode().Perm(), want)
	}
}
