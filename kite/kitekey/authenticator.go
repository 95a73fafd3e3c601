package kitekey

import (
	"context"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
)

// Authenticator is the kite.Authenticator for the three JWT auth types:
//
//   - kite.AuthKiteKey: a kite key; Principal{Username: sub, KiteID: jti, TokenID: jti}.
//   - kite.AuthToken: a token whose aud must be exactly the id of the kite being dialed (self.ID).
//   - kite.AuthSession: a session; Principal.Admin is claims.Admin || IsAdmin(sub).
//
// Any other type is rejected with an error wrapping kite.ErrAuth.
type Authenticator struct {
	Verifier *Verifier
	IsAdmin  func(username string) bool // optional; consulted for sessions
}

var _ kite.Authenticator = (*Authenticator)(nil)

// Authenticate verifies a as presented to the kite self.
func (a *Authenticator) Authenticate(ctx context.Context, self kite.Identity, au kite.Auth) (*kite.Principal, error) {
	if a == nil || a.Verifier == nil {
		return nil, fmt.Errorf("authenticate %s: no verifier configured", au.Type)
	}
	switch au.Type {
	case kite.AuthKiteKey:
		c, err := a.Verifier.KiteKey(ctx, au.Key)
		if err != nil {
			return nil, err
		}
		p := &kite.Principal{Username: c.Subject, Type: au.Type, KiteID: c.ID, TokenID: c.ID}
		if c.ExpiresAt != nil {
			p.Expires = c.ExpiresAt.Time
		}
		return p, nil
	case kite.AuthToken:
		if self.ID == "" {
			return nil, fmt.Errorf("token: %w: this kite has no id to match aud against", ErrWrongAudience)
		}
		c, err := a.Verifier.Token(ctx, au.Key, self.ID)
		if err != nil {
			return nil, err
		}
		return &kite.Principal{Username: c.Subject, Type: au.Type, TokenID: c.ID, Expires: c.ExpiresAt.Time}, nil
	case kite.AuthSession:
		c, err := a.Verifier.Session(ctx, au.Key)
		if err != nil {
			return nil, err
		}
		admin := c.Admin || (a.IsAdmin != nil && a.IsAdmin(c.Subject))
		return &kite.Principal{Username: c.Subject, Type: au.Type, TokenID: c.ID, Expires: c.ExpiresAt.Time, Admin: admin}, nil
	}
	return nil, fmt.Errorf("auth type %q: %w: want %q, %q or %q", short(au.Type), kite.ErrAuth,
		kite.AuthKiteKey, kite.AuthToken, kite.AuthSession)
}
