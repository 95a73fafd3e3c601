package kite

import (
	"context"
	"time"
)

// Auth types a dialing kite may present in kite.handshake.
const (
	AuthKiteKey = "kiteKey" // a kite.key JWT: proves the kite's owner and its kite id (jti)
	AuthToken   = "token"   // a short-lived token whose aud is the kite being dialed
	AuthSession = "session" // a logged-in user's session JWT issued by kloud
)

// Auth is the credential in kite.handshake.
type Auth struct {
	Type string `json:"type"`
	Key  string `json:"key"`
}

// Principal is who a handshake proved the peer to be.
type Principal struct {
	Username string    // the JWT subject; every call on the connection runs as this user
	Type     string    // the auth type that proved it
	KiteID   string    // for kite keys: the jti, which is the kite's id
	TokenID  string    // the credential's jti
	Expires  time.Time // zero if the credential does not expire (kite keys)
	Admin    bool      // set by authenticators that know the user is an administrator
}

// Authenticator verifies the credential a peer presents to the kite self. Errors should wrap
// ErrAuth with a reason a human can act on ("token expired", "unknown signing key").
type Authenticator interface {
	Authenticate(ctx context.Context, self Identity, a Auth) (*Principal, error)
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(ctx context.Context, self Identity, a Auth) (*Principal, error)

// Authenticate calls f.
func (f AuthenticatorFunc) Authenticate(ctx context.Context, self Identity, a Auth) (*Principal, error) {
	return f(ctx, self, a)
}

var _ Authenticator = AuthenticatorFunc(nil)
