package kloud

import (
	"context"
	"time"
)

// SealSSOFlow exposes the kloud_oidc cookie of a sign-in flow to the external tests, so a test
// can be a browser whose flow's nonce differs from the ID token's.
func (s *Server) SealSSOFlow(state, nonce, verifier string) (string, error) {
	return s.sealSSOFlow(ssoFlow{State: state, Nonce: nonce, Verifier: verifier, Expires: time.Now().Add(ssoFlowTTL)})
}

// VerifySSOToken exposes the ID token check of the callback (signature, issuer, audience,
// expiry, nonce) to the external tests.
func (s *Server) VerifySSOToken(ctx context.Context, raw, nonce string) error {
	p, err := s.sso.provider(ctx)
	if err != nil {
		return err
	}
	_, err = s.sso.verify(ctx, p, raw, nonce)
	return err
}

// SSOCookie is the name of the sign-in flow's cookie.
const SSOCookie = ssoCookie
