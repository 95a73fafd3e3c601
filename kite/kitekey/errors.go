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
	ErrMalformed     = &reason{"malformed credential", kite.ErrAuth}
	ErrAlgorithm     = &reason{"signing algorithm not accepted", kite.ErrAuth}
	ErrUnknownKey    = &reason{"unknown signing key", kite.ErrAuth}
	ErrKeyRetired    = &reason{"signing key retired", ErrUnknownKey}
	ErrBadSignature  = &reason{"bad signature", kite.ErrAuth}
	ErrWrongKind     = &reason{"wrong kind of credential", kite.ErrAuth}
	ErrExpired       = &reason{"expired", kite.ErrAuth}
	ErrNotYetValid   = &reason{"not valid yet", kite.ErrAuth}
	ErrWrongIssuer   = &reason{"wrong issuer", kite.ErrAuth}
	ErrWrongAudience = &reason{"wrong audience", kite.ErrAuth}
	ErrLifetime      = &reason{"lifetime not allowed", kite.ErrAuth}
	ErrMissingClaim  = &reason{"missing claim", kite.ErrAuth}
	ErrRevoked       = &reason{"revoked", kite.ErrAuth}
)
