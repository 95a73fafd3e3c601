package kitekey

import (
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Kinds: the "kind" claim every JWT of ours carries, so that one kind can never stand in for
// another (a kite key is not a token, a token is not a session).
const (
	KindKiteKey = "kiteKey"
	KindToken   = "token"
	KindSession = "session"
)

// Lifetime limits, enforced when signing and when verifying (plus leeway).
const (
	MaxTokenTTL   = time.Hour           // exp - iat of a token
	MaxSessionTTL = 30 * 24 * time.Hour // exp - iat of a session
)

// KiteKeyClaims are the claims of a kite key (the kite.key file): iss = kontrol, sub = the owner,
// jti = the kite id, iat. No exp: a kite key is valid until its jti is revoked or its signing key
// is retired.
type KiteKeyClaims struct {
	jwt.RegisteredClaims
	Kind       string `json:"kind"`
	KontrolURL string `json:"kontrolURL"`
}

// TokenClaims are the claims of a token: sub = the caller, aud = exactly one kite id, iat, nbf,
// exp at most MaxTokenTTL after iat, random jti. There is no audience that matches every kite.
type TokenClaims struct {
	jwt.RegisteredClaims
	Kind string `json:"kind"`
}

// SessionClaims are the claims of a logged-in user's session: sub = the user, iat, nbf, exp,
// random jti, and Admin if the user was an administrator when the session was issued.
type SessionClaims struct {
	jwt.RegisteredClaims
	Kind  string `json:"kind"`
	Admin bool   `json:"admin,omitempty"`
}

// claims is what the verifier needs from each claims type.
type claims interface {
	jwt.Claims
	kind() string
	registered() *jwt.RegisteredClaims
}

func (c *KiteKeyClaims) kind() string                      { return c.Kind }
func (c *KiteKeyClaims) registered() *jwt.RegisteredClaims { return &c.RegisteredClaims }
func (c *TokenClaims) kind() string                        { return c.Kind }
func (c *TokenClaims) registered() *jwt.RegisteredClaims   { return &c.RegisteredClaims }
func (c *SessionClaims) kind() string                      { return c.Kind }
func (c *SessionClaims) registered() *jwt.RegisteredClaims { return &c.RegisteredClaims }
