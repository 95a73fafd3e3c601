package local

import (
	"github.com/kloud-dev/kloud/provider/buildtoken"
)

// Tokens of the local machine service (service.go): per-build HS256 JWTs (package
// provider/buildtoken) that ApplyTemplate mints for one stack build and hands to the stack's
// terraform as a sensitive variable.
const (
	tokenIssuer   = "kloud-local"
	tokenAudience = "kloud-local-machines/v1"
	// KeyFile is the service's HMAC key in the state dir (0600, root's): it survives a kloud
	// restart, so a build that outlives its kloud (terraformer runs on) still has a valid token.
	KeyFile = buildtoken.KeyFile
	// DefaultTokenTTL is how long a token is valid: one stack build (Options.TokenTTL).
	DefaultTokenTTL = buildtoken.DefaultTTL
)

// tokenClaims are what a token allows: create of the listed kloud machine ids of the stack, and
// read, retag and delete of machines recorded as the stack's and this kloud instance's.
type tokenClaims = buildtoken.Claims

// Token mints a token of the local machine service for stack's build that may create the given
// kloud machine ids (none: read, retag and destroy only). ApplyTemplate uses it.
func (l *Local) Token(stack string, machines []string) (string, error) {
	return l.tokens.Mint(stack, "", machines)
}

// parseToken verifies a token (buildtoken.Keyring.Parse): an expired one only with allowExpired
// (reading and destroying a stack's machines).
func (l *Local) parseToken(s string, allowExpired bool) (*tokenClaims, error) {
	return l.tokens.Parse(s, allowExpired)
}
