package kloud

import (
	"encoding/base64"
	"strings"
	"testing"

	"golang.org/x/crypto/argon2"
)

func TestPasswordHash(t *testing.T) {
	t.Parallel()
	h1, err := hashPassword("hunter2 hunter2")
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := hashPassword("hunter2 hunter2")
	if h1 == h2 {
		t.Fatal("two hashes of one password are equal: no random salt")
	}
	if !strings.HasPrefix(h1, "$argon2id$v=19$m=19456,t=2,p=1$") {
		t.Fatalf("hash format: %s", h1)
	}
	if !checkPasswordHash(h1, "hunter2 hunter2") || !checkPasswordHash(h2, "hunter2 hunter2") {
		t.Fatal("right password rejected")
	}
	for _, bad := range []string{"hunter2 hunter3", "", "hunter2 hunter2 "} {
		if checkPasswordHash(h1, bad) {
			t.Fatalf("wrong password %q accepted", bad)
		}
	}
	parts := strings.Split(h1, "$")
	for name, tampered := range map[string]string{
		"huge memory": strings.Replace(h1, "m=19456", "m=99999999", 1),
		"huge time":   strings.Replace(h1, "t=2", "t=1000", 1),
		"argon2i":     strings.Replace(h1, "argon2id", "argon2i", 1),
		"short hash":  strings.Join(append(parts[:5:5], "AAAA"), "$"),
		"not a hash":  "plaintext",
		"empty":       "",
	} {
		if checkPasswordHash(tampered, "hunter2 hunter2") {
			t.Errorf("%s: accepted", name)
		}
	}
	// Parameters are read from the hash, so older (cheaper or dearer) hashes keep working.
	salt := []byte("some salt value!")
	key := argon2.IDKey([]byte("password"), salt, 1, 8192, 1, 32)
	old := "$argon2id$v=19$m=8192,t=1,p=1$" + base64.RawStdEncoding.EncodeToString(salt) + "$" + base64.RawStdEncoding.EncodeToString(key)
	if !checkPasswordHash(old, "password") || checkPasswordHash(old, "Password") {
		t.Fatal("a hash with other parameters is not checked with its own parameters")
	}
}
