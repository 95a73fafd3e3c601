package plugin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// BootTokens signs the tokens a provider's own boot service (its Provider.Handler, which the
// build's generated resources call to boot a machine and to destroy it) hands a build in
// ApplyTemplate, and checks them when the calls come: the token is Prefix, then the claims as
// JSON, then an HMAC-SHA256 of them, both base64url. The key is 32 random bytes kept in KeyFile,
// so that tokens outlive a restart of the provider (a stack is destroyed long after it was built).
// The claims are the provider's own type: what the build may do (the stack, the sha256 of each
// machine's script, ScriptSum) and until when. The dummy provider and
// examples/provider-example use it. The zero value is not usable: set Prefix and KeyFile. Safe for
// concurrent use.
type BootTokens struct {
	// Prefix starts every token, e.g. "ex1.": a version, so that a later format is told apart.
	Prefix string
	// KeyFile is the key's file. It is made (mode 0600, its directory 0700 if missing) on first
	// use; of several processes making it at once, the first one's key is everybody's.
	KeyFile string

	mu  sync.Mutex
	key []byte
}

// ErrBootToken is the error of a token that BootTokens did not sign, or that is malformed.
var ErrBootToken = errors.New("invalid token")

// Key returns the HMAC key, read from KeyFile or made there on first use.
func (t *BootTokens) Key() ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.key != nil {
		return t.key, nil
	}
	if t.KeyFile == "" {
		return nil, errors.New("token key: no key file")
	}
	key, err := os.ReadFile(t.KeyFile)
	if errors.Is(err, fs.ErrNotExist) {
		key, err = t.makeKey()
	}
	if err != nil {
		return nil, fmt.Errorf("token key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("token key %s has %d bytes, want 32", t.KeyFile, len(key))
	}
	t.key = key
	return key, nil
}

// makeKey writes a fresh key aside and links it into place: a link fails if the file exists, so
// the first writer wins, and nobody reads a key half written.
func (t *BootTokens) makeKey() ([]byte, error) {
	dir := filepath.Dir(t.KeyFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	fresh := make([]byte, 32)
	rand.Read(fresh)
	f, err := os.CreateTemp(dir, filepath.Base(t.KeyFile)+".new*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(fresh)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(f.Name(), t.KeyFile)
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return os.ReadFile(t.KeyFile)
}

// Mint returns a token of claims (any value encoding/json encodes).
func (t *BootTokens) Mint(claims any) (string, error) {
	key, err := t.Key()
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("token claims: %w", err)
	}
	payload := base64.RawURLEncoding.EncodeToString(body)
	return t.Prefix + payload + "." + base64.RawURLEncoding.EncodeToString(t.mac(key, payload)), nil
}

// Verify checks that token is one of Mint's and decodes its claims into claims (a pointer). It
// returns ErrBootToken for a token it did not sign or cannot decode; what the claims allow (and
// their expiry) is for the caller to check.
func (t *BootTokens) Verify(token string, claims any) error {
	key, err := t.Key()
	if err != nil {
		return err
	}
	rest, ok := strings.CutPrefix(token, t.Prefix)
	payload, sig, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return ErrBootToken
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, t.mac(key, payload)) {
		return ErrBootToken
	}
	body, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || json.Unmarshal(body, claims) != nil {
		return ErrBootToken
	}
	return nil
}

func (t *BootTokens) mac(key []byte, payload string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(t.Prefix + payload))
	return h.Sum(nil)
}

// ScriptSum is the hex sha256 of a machine's script, as a token's claims name it: the boot service
// runs only a script whose sum the build's token carries.
func ScriptSum(script []byte) string {
	s := sha256.Sum256(script)
	return hex.EncodeToString(s[:])
}

// nameRe is what ValidName accepts.
var nameRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// ValidName reports whether s (a stack id, a machine label) can name one directory of a boot
// service's state: letters, digits, '_', '.' and '-', at most 128, not starting with '.' or '-'.
func ValidName(s string) bool { return nameRe.MatchString(s) && s != "." && s != ".." }
