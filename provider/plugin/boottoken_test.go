package plugin_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kloud-dev/kloud/provider/plugin"
)

type testClaims struct {
	Stack    string            `json:"stack"`
	Machines map[string]string `json:"machines"`
}

func TestBootTokens(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	keyFile := filepath.Join(dir, "token.key")
	a := &plugin.BootTokens{Prefix: "t1.", KeyFile: keyFile}
	want := testClaims{Stack: "s1", Machines: map[string]string{"dev.0": plugin.ScriptSum([]byte("echo hi\n"))}}
	tok, err := a.Mint(want)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, "t1.") {
		t.Fatalf("token %q lacks its prefix", tok)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
		t.Fatalf("key file: %v %v", fi, err)
	}

	// Another signer on the same key file (a restarted provider) accepts the token.
	b := &plugin.BootTokens{Prefix: "t1.", KeyFile: keyFile}
	var got testClaims
	if err := b.Verify(tok, &got); err != nil {
		t.Fatal(err)
	}
	if got.Stack != want.Stack || got.Machines["dev.0"] != want.Machines["dev.0"] {
		t.Fatalf("claims %+v, want %+v", got, want)
	}

	// Tampered, truncated, re-prefixed, or signed with another key: refused.
	payload, sig, _ := strings.Cut(strings.TrimPrefix(tok, "t1."), ".")
	other := &plugin.BootTokens{Prefix: "t1.", KeyFile: filepath.Join(t.TempDir(), "k")}
	otherTok, err := other.Mint(want)
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"payload":   "t1." + payload[:len(payload)-2] + "AA." + sig,
		"signature": "t1." + payload + "." + sig[:len(sig)-2] + "AA",
		"no sig":    "t1." + payload,
		"prefix":    "t2." + payload + "." + sig,
		"other key": otherTok,
		"empty":     "",
	} {
		if err := b.Verify(bad, &got); !errors.Is(err, plugin.ErrBootToken) {
			t.Errorf("%s: Verify = %v, want ErrBootToken", name, err)
		}
	}

	// A key file of the wrong size is an error, not a key.
	short := filepath.Join(t.TempDir(), "short.key")
	if err := os.WriteFile(short, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (&plugin.BootTokens{Prefix: "t1.", KeyFile: short}).Mint(want); err == nil || errors.Is(err, plugin.ErrBootToken) {
		t.Fatalf("Mint with a 5-byte key = %v, want an error about the key", err)
	}
}

// TestBootTokensFirstKeyWins: signers that make the key at once all end up with the first one's.
func TestBootTokensFirstKeyWins(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "token.key")
	signers := make([]*plugin.BootTokens, 8)
	toks := make([]string, len(signers))
	var wg sync.WaitGroup
	for i := range signers {
		signers[i] = &plugin.BootTokens{Prefix: "t1.", KeyFile: keyFile}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if toks[i], err = signers[i].Mint(testClaims{Stack: "s"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, tok := range toks {
		for j, s := range signers {
			var c testClaims
			if err := s.Verify(tok, &c); err != nil {
				t.Errorf("signer %d refuses signer %d's token: %v", j, i, err)
			}
		}
	}
	left, _ := filepath.Glob(keyFile + ".new*")
	if len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

func TestValidName(t *testing.T) {
	for s, want := range map[string]bool{
		"dev.0": true, "stack_1": true, "a": true, ".": false, "..": false, "": false,
		"-x": false, ".hidden": false, "a/b": false, strings.Repeat("a", 128): true, strings.Repeat("a", 129): false,
	} {
		if plugin.ValidName(s) != want {
			t.Errorf("ValidName(%q) = %v, want %v", s, !want, want)
		}
	}
}
