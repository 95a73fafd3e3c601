package store_test

import (
	"bytes"
	"testing"

	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

func TestSealOpen(t *testing.T) {
	t.Parallel()
	s := storetest.New(t)
	pt := []byte("aws secret key")
	aad := []byte("credentials/c1")
	ct, err := s.Seal(pt, aad)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(ct, pt) {
		t.Fatal("ciphertext contains the plaintext")
	}
	got, err := s.Open(ct, aad)
	if err != nil || !bytes.Equal(got, pt) {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	ct2, _ := s.Seal(pt, aad)
	if bytes.Equal(ct, ct2) {
		t.Fatal("two seals of one plaintext are equal: nonce not random")
	}
	if _, err := s.Open(ct, []byte("credentials/c2")); err == nil {
		t.Fatal("opened with another document's aad")
	}
	for i := range ct {
		bad := bytes.Clone(ct)
		bad[i] ^= 0x01
		if _, err := s.Open(bad, aad); err == nil {
			t.Fatalf("opened a ciphertext with byte %d flipped", i)
		}
	}
	if _, err := s.Open(ct[:len(ct)-1], aad); err == nil {
		t.Fatal("opened a truncated ciphertext")
	}
	if _, err := s.Open(nil, aad); err == nil {
		t.Fatal("opened nil")
	}
	// Another store has another key.
	if _, err := storetest.New(t).Open(ct, aad); err == nil {
		t.Fatal("opened with another store's key")
	}
	empty, err := s.Seal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Open(empty, nil); err != nil || len(got) != 0 {
		t.Fatalf("empty round trip: %q, %v", got, err)
	}
}
