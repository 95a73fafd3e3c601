package vagrant

import (
	"errors"

	"github.com/kloud-dev/kloud/provider/buildtoken"
)

// Tokens of the vagrant machine service (service.go): per-build HS256 JWTs (package
// provider/buildtoken) that ApplyTemplate mints for one stack build and hands to the stack's
// terraform as a sensitive variable; they also name the stack's owner, whose vagrant host the
// service works on.
const (
	tokenIssuer   = "kloud-vagrant"
	tokenAudience = "kloud-vagrant-machines/v1"
	// KeyFile is the service's HMAC key in the state dir (0600): it survives a kloud restart.
	KeyFile = buildtoken.KeyFile
	// DefaultTokenTTL is how long a token is valid: one stack build (Options.TokenTTL).
	DefaultTokenTTL = buildtoken.DefaultTTL
)

// tokenClaims are what a token allows (buildtoken.Claims; Owner is always set).
type tokenClaims = buildtoken.Claims

// Token mints a token of the vagrant machine service for the build of stack (of owner) that may
// create the given kloud machine ids (none: read, retag and destroy only).
func (v *Vagrant) Token(stack, owner string, machines []string) (string, error) {
	return v.tokens.Mint(stack, owner, machines)
}

// parseToken verifies a token (buildtoken.Keyring.Parse) and that it names an owner.
func (v *Vagrant) parseToken(s string, allowExpired bool) (*tokenClaims, error) {
	c, err := v.tokens.Parse(s, allowExpired)
	if err != nil {
		return nil, err
	}
	if c.Owner == "" {
		return nil, errors.New("token names no stack or no owner")
	}
	return c, nil
}
