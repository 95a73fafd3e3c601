package filehash

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSHA256(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	// FIPS 180-2's example: SHA-256("abc").
	if got, err := SHA256(p); err != nil || got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("SHA256: %s %v", got, err)
	}
	if _, err := SHA256(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing file hashed")
	}
}
