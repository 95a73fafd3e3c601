package stackbuild

import (
	"encoding/json"
	"fmt"

	"github.com/kloud-dev/kloud/kloud/model"
)

// A stack's sensitive parameter values (Stack.SecretSealed) are sealed by the store, bound to
// the stack; a build opens them for terraform and nothing else.

// secretsAAD binds sealed values to their stack.
func secretsAAD(stackID string) []byte { return []byte("stacks/" + stackID + "/secrets") }

// Sealer seals with the store's key (store.Store).
type Sealer interface {
	Seal(plaintext, aad []byte) ([]byte, error)
}

// SealSecrets seals the values of stack stackID's sensitive parameters for Stack.SecretSealed;
// none: nil.
func SealSecrets(s Sealer, stackID string, secret map[string]string) ([]byte, error) {
	if len(secret) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(secret)
	if err != nil {
		return nil, fmt.Errorf("sensitive parameters: %w", err)
	}
	sealed, err := s.Seal(b, secretsAAD(stackID))
	if err != nil {
		return nil, fmt.Errorf("sensitive parameters: %w", err)
	}
	return sealed, nil
}

// Variables is vars (the stack's Variables, or an update's) with the stack's sensitive values
// opened: what a build of the stack gives terraform.
func (f *Flow) Variables(st *model.Stack, vars map[string]string) (map[string]string, error) {
	if len(st.SecretSealed) == 0 {
		return vars, nil
	}
	b, err := f.d.Store.Open(st.SecretSealed, secretsAAD(st.ID))
	if err != nil {
		return nil, fmt.Errorf("stack %s: sensitive parameters: %w", st.ID, err)
	}
	var secret map[string]string
	if err := json.Unmarshal(b, &secret); err != nil {
		return nil, fmt.Errorf("stack %s: sensitive parameters: %w", st.ID, err)
	}
	out := make(map[string]string, len(vars)+len(secret))
	for k, v := range vars {
		out[k] = v
	}
	for k, v := range secret {
		out[k] = v
	}
	return out, nil
}
