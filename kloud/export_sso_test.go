package kloud

import (
	"context"

	"github.com/kloud-dev/kloud/kloud/login"
)

// SealSSOFlow exposes the kloud_oidc cookie of a sign-in flow to the external tests, so a test
// can be a browser whose flow's nonce differs from the ID token's.
func (s *Server) SealSSOFlow(state, nonce, verifier string) (string, error) {
	return s.login.SealFlow(state, nonce, verifier)
}

// VerifySSOToken exposes the ID token check of the callback (signature, issuer, audience,
// expiry, nonce) to the external tests.
func (s *Server) VerifySSOToken(ctx context.Context, raw, nonce string) error {
	return s.login.VerifyIDToken(ctx, raw, nonce)
}

// SSOCookie is the name of the sign-in flow's cookie.
const SSOCookie = login.SSOCookie
