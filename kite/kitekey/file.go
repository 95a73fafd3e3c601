package kitekey

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// WriteFile writes a kite key or an agent key to path with mode 0400, creating the parent directory with mode
// 0700 if needed. It replaces an existing file (even a read-only one) atomically: the key goes
// to a temporary file in the same directory, which is synced and renamed over path.
func WriteFile(path, key string) error {
	key = strings.TrimSpace(key)
	if _, err := ParseKeyFile(key); err != nil {
		return fmt.Errorf("write kite key %s: %w", path, err)
	}
	return writeAtomic(path, []byte(key+"\n"), 0o400)
}

// ReadFile reads a kite key or agent key written by WriteFile (or by hand, or by cloud-init),
// trimming surrounding whitespace.
// It fails with a readable error if the file is missing, empty, or not a kite key; it does not
// verify the signature (only kontrol and the kites it serves can).
func ReadFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read kite key: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxLen+1024))
	if err != nil {
		return "", fmt.Errorf("read kite key %s: %w", path, err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", fmt.Errorf("kite key file %s is empty", path)
	}
	if _, err := ParseKeyFile(key); err != nil {
		return "", fmt.Errorf("kite key file %s: %w", path, err)
	}
	return key, nil
}

// ParseUnverified reads the claims of a kite key (kind kiteKey only; ParseKeyFile reads agent
// keys too) WITHOUT checking its signature, so that a kite
// can learn its own username (sub), kite id (jti), kontrol (iss) and kontrol URL from its
// kite.key. Never use it to decide whom to trust: that is Verifier.KiteKey. It checks the shape
// Verifier checks before the signature (alg EdDSA, a kid) and the claims a kite needs; errors
// wrap one of the reasons (and so kite.ErrAuth).
func ParseUnverified(raw string) (*KiteKeyClaims, error) {
	c, err := parseKiteKey(raw)
	if err != nil {
		return nil, fmt.Errorf("kite key: %w", err)
	}
	return c, nil
}

func parseKiteKey(raw string) (*KiteKeyClaims, error) {
	if _, err := parseHeader(raw); err != nil {
		return nil, err
	}
	c := &KiteKeyClaims{}
	if _, _, err := jwt.NewParser(jwt.WithStrictDecoding()).ParseUnverified(raw, c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	switch {
	case c.Kind != KindKiteKey:
		return nil, fmt.Errorf("%w: kind %q, want %q", ErrWrongKind, short(c.Kind), KindKiteKey)
	case c.Subject == "":
		return nil, fmt.Errorf("%w: no sub", ErrMissingClaim)
	case c.ID == "":
		return nil, fmt.Errorf("%w: no jti", ErrMissingClaim)
	case c.Issuer == "":
		return nil, fmt.Errorf("%w: no iss", ErrMissingClaim)
	}
	return c, nil
}

// KeyFile is what a kite.key file says about its holder, read WITHOUT checking the signature
// (ParseKeyFile): for a kite key and for a machine agent's key.
type KeyFile struct {
	Kind       string // KindKiteKey or KindAgentKey
	Issuer     string
	Subject    string // a kite key's user; an agent key's "machine:<id>"
	KiteID     string // jti
	KontrolURL string
	// Owner is the user the kite runs for: a kite key's subject, an agent key's owner claim.
	Owner     string
	MachineID string // agent keys only
	StackID   string // agent keys only
}

// Agent reports whether the key is a machine agent's: an agent key, or a kite key minted for an
// agent before agent keys had their own kind (its kite id starts with AgentIDPrefix).
func (k *KeyFile) Agent() bool {
	return k.Kind == KindAgentKey || strings.HasPrefix(k.KiteID, AgentIDPrefix)
}

// ParseKeyFile reads the claims of a kite key or an agent key WITHOUT checking its signature,
// so that a kite can learn who it is from its kite.key (as ParseUnverified, which it extends to
// agent keys). Never use it to decide whom to trust: that is Verifier.
func ParseKeyFile(raw string) (*KeyFile, error) {
	if _, err := parseHeader(raw); err != nil {
		return nil, fmt.Errorf("kite key: %w", err)
	}
	c := &AgentKeyClaims{} // a superset of KiteKeyClaims
	if _, _, err := jwt.NewParser(jwt.WithStrictDecoding()).ParseUnverified(raw, c); err != nil {
		return nil, fmt.Errorf("kite key: %w: %w", ErrMalformed, err)
	}
	k := &KeyFile{Kind: c.Kind, Issuer: c.Issuer, Subject: c.Subject, KiteID: c.ID, KontrolURL: c.KontrolURL,
		Owner: c.Subject, MachineID: c.MachineID, StackID: c.StackID}
	switch c.Kind {
	case KindKiteKey:
		k.MachineID, k.StackID = "", ""
	case KindAgentKey:
		k.Owner = c.Owner
		if k.Owner == "" {
			return nil, fmt.Errorf("agent key: %w: no owner", ErrMissingClaim)
		}
	default:
		return nil, fmt.Errorf("kite key: %w: kind %q, want %q or %q", ErrWrongKind, short(c.Kind), KindKiteKey, KindAgentKey)
	}
	switch {
	case c.Subject == "":
		return nil, fmt.Errorf("kite key: %w: no sub", ErrMissingClaim)
	case c.ID == "":
		return nil, fmt.Errorf("kite key: %w: no jti", ErrMissingClaim)
	case c.Issuer == "":
		return nil, fmt.Errorf("kite key: %w: no iss", ErrMissingClaim)
	}
	return k, nil
}
