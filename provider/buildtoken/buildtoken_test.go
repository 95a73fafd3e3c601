package buildtoken_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/provider/buildtoken"
)

func keyring(dir, instance string, ttl time.Duration) *buildtoken.Keyring {
	return buildtoken.New(buildtoken.Options{Dir: dir, Issuer: "kloud-test", Audience: "kloud-test/v1", Instance: instance, TTL: ttl})
}

func TestMintParse(t *testing.T) {
	dir := t.TempDir()
	k := keyring(dir, "i1", 0)
	tok, err := k.Mint("s1", "alice", []string{"m1"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := k.Parse(tok, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Stack != "s1" || c.Owner != "alice" || !c.MayCreate("m1") || c.MayCreate("m2") || c.MayCreate("") {
		t.Errorf("claims %+v", c)
	}
	st, err := os.Stat(filepath.Join(dir, buildtoken.KeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	// The same key after a restart (a new Keyring on the same dir); another instance refuses it.
	if _, err := keyring(dir, "i1", 0).Parse(tok, false); err != nil {
		t.Errorf("after a restart: %v", err)
	}
	if _, err := keyring(dir, "i2", 0).Parse(tok, false); err == nil || !strings.Contains(err.Error(), "instance") {
		t.Errorf("another instance: %v", err)
	}
	// Another key (dir) or a tampered token: refused.
	if _, err := keyring(t.TempDir(), "i1", 0).Parse(tok, false); err == nil {
		t.Error("a token of another key was accepted")
	}
	if _, err := k.Parse(tok[:len(tok)-2]+"xx", false); err == nil {
		t.Error("a tampered token was accepted")
	}
	// A key file others may read is refused.
	os.Chmod(filepath.Join(dir, buildtoken.KeyFile), 0o644)
	if _, err := keyring(dir, "i1", 0).Mint("s1", "", nil); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("a readable key file: %v", err)
	}
}

func TestExpired(t *testing.T) {
	k := keyring(t.TempDir(), "i1", time.Nanosecond)
	tok, err := k.Mint("s1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second) // past the 5 s leeway
	if _, err := k.Parse(tok, false); err == nil {
		t.Error("an expired token was accepted for create")
	}
	if c, err := k.Parse(tok, true); err != nil || c.Stack != "s1" {
		t.Errorf("an expired token for read/destroy: %+v %v", c, err)
	}
}
