package kitekey

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"time"
)

// Algorithm and curve names in JWT headers and JWKs (RFC 8037).
const (
	AlgEdDSA   = "EdDSA"
	CrvEd25519 = "Ed25519"
	KtyOKP     = "OKP"
)

// KeyPair is an Ed25519 signing key with its kid. Values handed out by a Keyring are snapshots:
// do not modify them.
type KeyPair struct {
	ID        string // kid: KeyID(Public)
	Private   ed25519.PrivateKey
	Public    ed25519.PublicKey
	CreatedAt time.Time
	RetiredAt *time.Time // nil while the key verifies
}

// GenerateKey makes a new key pair from crypto/rand, created now.
func GenerateKey() (*KeyPair, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ed25519 key: %w", err)
	}
	return &KeyPair{ID: KeyID(pub), Private: priv, Public: pub, CreatedAt: time.Now().UTC()}, nil
}

// KeyID derives a kid from a public key: the first 16 characters (96 bits) of the unpadded
// base64url SHA-256 of the raw key. A kid therefore names exactly one key.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(sum[:])[:16]
}

// Retired reports whether the key has been retired.
func (k *KeyPair) Retired() bool { return k.RetiredAt != nil }

// JWK returns the public half of k.
func (k *KeyPair) JWK() PublicKey {
	return PublicKey{
		ID:  k.ID,
		Kty: KtyOKP,
		Alg: AlgEdDSA,
		Crv: CrvEd25519,
		X:   base64.RawURLEncoding.EncodeToString(k.Public),
	}
}

// PublicKey is the public half of a signing key as a JWK (RFC 8037, kty OKP, crv Ed25519,
// x = unpadded base64url of the 32-byte key). kontrol hands these out; RemoteKeys consumes them.
type PublicKey struct {
	ID  string `json:"kid"`
	Kty string `json:"kty"`
	Alg string `json:"alg"`
	Crv string `json:"crv"`
	X   string `json:"x"`
}

// Ed25519 decodes and checks the key: alg, crv and kty (if set) must name Ed25519, x must hold
// 32 bytes, and kid must equal KeyID of the key.
func (p PublicKey) Ed25519() (ed25519.PublicKey, error) {
	if p.Alg != AlgEdDSA || p.Crv != CrvEd25519 || (p.Kty != "" && p.Kty != KtyOKP) {
		return nil, fmt.Errorf("public key %q: alg %q crv %q kty %q, want EdDSA Ed25519 OKP", p.ID, p.Alg, p.Crv, p.Kty)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(p.X)
	if err != nil {
		return nil, fmt.Errorf("public key %q: decode x: %w", p.ID, err)
	}
	if len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("public key %q: x has %d bytes, want %d", p.ID, len(b), ed25519.PublicKeySize)
	}
	pub := ed25519.PublicKey(b)
	if id := KeyID(pub); id != p.ID {
		return nil, fmt.Errorf("public key %q: kid does not match the key (want %q)", p.ID, id)
	}
	return pub, nil
}

// KeySource finds the public key that verifies signatures made with kid. An unknown (or retired)
// kid is an error wrapping ErrUnknownKey; other errors (a keyring that cannot be reached) are
// returned as they are and are not authentication failures.
type KeySource interface {
	PublicKey(ctx context.Context, kid string) (ed25519.PublicKey, error)
}

// KeySourceFunc adapts a function to KeySource.
type KeySourceFunc func(ctx context.Context, kid string) (ed25519.PublicKey, error)

// PublicKey calls f.
func (f KeySourceFunc) PublicKey(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	return f(ctx, kid)
}

// Revoker reports whether a credential's jti (for kite keys, the kite id) has been revoked.
type Revoker interface {
	IsRevoked(ctx context.Context, jti string) (bool, error)
}

// RevokerFunc adapts a function to Revoker.
type RevokerFunc func(ctx context.Context, jti string) (bool, error)

// IsRevoked calls f.
func (f RevokerFunc) IsRevoked(ctx context.Context, jti string) (bool, error) { return f(ctx, jti) }

var (
	_ KeySource = KeySourceFunc(nil)
	_ Revoker   = RevokerFunc(nil)
)
