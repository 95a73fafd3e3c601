package kloud

import (
	"encoding/json"
	"errors"
	"sort"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// A credential's secrets: its Terraform variables (credentialVariables), the values to redact and
// the redactor that keeps them out of every response, error and log line (credentials.go).

// credentialVariables maps a credential's fields, and its bootstrap outputs, to Terraform
// variables named <provider>_<field> (Koding's naming), and lists the names of those that hold
// secrets (sorted). A credential field wins over a bootstrap output of the same name. Values
// that are maps (a plugin's, decoded in its process) have their secrets named by the part's
// schema (writeOnly); those of a provider without a schema for the part are all treated as
// secret.
func credentialVariables(p *provider.Provider, cred *provider.Credential) (vars map[string]any, secret []string) {
	vars = map[string]any{}
	add := func(v any, part string) {
		if v == nil {
			return
		}
		m := provider.JSONMap(v)
		_, isMap := v.(map[string]any)
		secretFields := provider.SecretFields(v)
		if isMap && p.HasPart(part) {
			isMap, secretFields = false, partSecrets(p, part)
		}
		for name, val := range m {
			key := p.Name + "_" + name
			if _, dup := vars[key]; dup {
				continue
			}
			vars[key] = val
			if isMap || secretFields[name] {
				secret = append(secret, key)
			}
		}
	}
	if cred != nil {
		add(cred.Value, provider.PartCredential)
		add(cred.Bootstrap, provider.PartBootstrap)
	}
	sort.Strings(secret)
	return vars, secret
}

// secretValues returns the secret field values of v as strings, for redaction. Values shorter
// than 3 characters are left out: hiding them would garble messages without protecting much.
func secretValues(v any, secretFields map[string]bool) []string {
	var out []string
	for name, val := range provider.JSONMap(v) {
		if !secretFields[name] {
			continue
		}
		var s string
		switch x := val.(type) {
		case string:
			s = x
		case json.Number:
			s = x.String()
		default:
			continue
		}
		if len(s) >= 3 {
			out = append(out, s)
		}
	}
	// Longest first, so a secret containing another is replaced whole.
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// redactor hides secret values in text that came from elsewhere (provider errors, Terraform).
type redactor []string

func (r redactor) String(s string) string {
	for _, sec := range r {
		s = strings.ReplaceAll(s, sec, "[secret]")
	}
	return s
}

// Err returns err with its message redacted, keeping the kite error kind it wraps.
func (r redactor) Err(err error) error {
	if err == nil {
		return nil
	}
	out := &redactedError{msg: r.String(err.Error())}
	var ke *kite.Error
	if errors.As(err, &ke) {
		out.kind = &kite.Error{Code: ke.Code, Message: "redacted", Data: ke.Data}
	}
	return out
}

// redactedError is an error whose message was redacted; it still matches the kite error kind
// of the original (errors.Is compares codes).
type redactedError struct {
	msg  string
	kind error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.kind }
