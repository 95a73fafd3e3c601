package kitekey

import "github.com/kloud-dev/kloud/kite"

// reason is a sentinel that names why a credential was rejected. Every reason wraps
// kite.ErrAuth, so errors.Is(err, kite.ErrAuth) holds for all of them and kite.ToWire sends them
// as -32001 with the full, readable message.
type reason struct {
	msg    string
	parent error
}

func (r *reason) Error() string { return r.msg }
func (r *reason) Unwrap() error { return r.parent }

// Reasons a credential is rejected. Each wraps kite.ErrAuth; ErrKeyRetired also wraps
// ErrUnknownKey. Returned errors add what was checked and the offending values, e.g.
// "token: expired at 2026-01-02T15:04:05Z (now 2026-01-02T15:10:00Z, leeway 30s)".
var (
	ErrMalformed     error = &reason{"malformed credential", kite.ErrAuth}
	ErrAlgorithm     error = &reason{"signing algorithm not accepted", kite.ErrAuth}
	ErrUnknownKey    error = &reason{"unknown signing key", kite.ErrAuth}
	ErrKeyRetired    error = &reason{"signing key retired", ErrUnknownKey}
	ErrBadSignature  error = &reason{"bad signature", kite.ErrAuth}
	ErrWrongKind     error = &reason{"wrong kind of credential", kite.ErrAuth}
	ErrExpired       error = &reason{"expired", kite.ErrAuth}
	ErrNotYetValid   error = &reason{"not valid yet", kite.ErrAuth}
	ErrWrongIssuer   error = &reason{"wrong issuer", kite.ErrAuth}
	ErrWrongAudience error = &reason{"wrong audience", kite.ErrAuth}
	ErrLifetime      error = &reason{"lifetime not allowed", kite.ErrAuth}
	ErrMissingClaim  error = &reason{"missing claim", kite.ErrAuth}
	ErrRevoked       error = &reason{"revoked", kite.ErrAuth}
)
