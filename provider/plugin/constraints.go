package plugin

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// Constraints over the wire: a plugin's vocabulary (provider.Provider.Constraints, as it is when
// the plugin registers) travels in its Manifest, and kloud's proxy describes it; the plugin's
// stack validates (provider.validateConstraints, CapConstraints), and a refusal wrapping
// provider.ErrConstraint reaches kloud wrapping provider.ErrConstraint again, with the provider's
// message (kloud answers invalid params).

// manifestConstraints is p's vocabulary for its manifest.
func manifestConstraints(p *provider.Provider) []provider.Constraint {
	if p.Constraints == nil {
		return nil
	}
	return p.Constraints()
}

// proxyConstraints is the proxy's Provider.Constraints for a manifest's vocabulary (nil: none).
func proxyConstraints(vocab []provider.Constraint) func() []provider.Constraint {
	if vocab == nil {
		return nil
	}
	return func() []provider.Constraint { return slices.Clone(vocab) }
}

// errConstraint is a constraint refusal on the wire: invalid params of type "constraint",
// which kloud's proxy turns back into an error wrapping provider.ErrConstraint.
var errConstraint = &kite.Error{Code: kite.CodeInvalidParams, Message: provider.ErrConstraint.Error(), Data: &kite.ErrorData{Type: typeConstraint}}

const typeConstraint = "constraint"

// constraintErr keeps a constraint refusal recognizable on the other side, with its message.
func constraintErr(err error) error {
	if err != nil && errors.Is(err, provider.ErrConstraint) {
		return fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+provider.ErrConstraint.Error()), errConstraint)
	}
	return err
}

// remoteConstraint sets re to a constraint refusal if the plugin's error ke is one.
func remoteConstraint(re *remoteError, ke *kite.Error) {
	if ke.Type() == typeConstraint {
		re.msg, re.is = strings.TrimSuffix(ke.Message, ": "+provider.ErrConstraint.Error()), provider.ErrConstraint
	}
}
