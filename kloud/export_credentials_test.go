package kloud

import (
	"context"

	"github.com/kloud-dev/kloud/provider"
)

// CredentialFor exposes credentialFor to the external tests, as username.
func (s *Server) CredentialFor(ctx context.Context, username, id, providerName string) (*provider.Credential, []string, error) {
	c, err := s.callerByName(ctx, username, false)
	if err != nil {
		return nil, nil, err
	}
	return s.credentialFor(ctx, c, id, providerName)
}

// CredentialVariables exposes credentialVariables to the external tests.
var CredentialVariables = credentialVariables
