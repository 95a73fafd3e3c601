package kite

import "time"

// Observer is told what a Kite serves, for metrics: kloud and terraformer export it to
// Prometheus (internal/metrics), the kite package itself imports no metrics library. Its
// methods run on the serving goroutines and must not block.
type Observer interface {
	// Served reports one served call (not notifications): method is the registered method's
	// name, or UnknownMethod for a name the kite does not serve (callers choose names: they
	// never become labels); code is the JSON-RPC error code answered, 0 for a result; d is how
	// long the handler ran.
	Served(method string, code int64, d time.Duration)
	// HandshakeRejected reports a served connection whose handshake failed, with one of the
	// Reject* reasons.
	HandshakeRejected(reason string)
}

// UnknownMethod is the method an Observer is given for calls of methods the kite does not serve.
const UnknownMethod = "unknown"

// Reasons a handshake is rejected (Observer.HandshakeRejected).
const (
	// RejectInvalid: the params were malformed (no auth, a bad identity).
	RejectInvalid = "invalid"
	// RejectCredential: the authenticator refused the credential (expired, revoked, unknown
	// signing key, wrong audience...), or the kite accepts none.
	RejectCredential = "credential"
	// RejectRefused: the credential was good but Options.OnHandshake refused the peer.
	RejectRefused = "refused"
	// RejectRepeated: a second handshake on a connection, or one on a dialed connection.
	RejectRepeated = "repeated"
	// RejectTimeout: no handshake within Options.HandshakeTimeout.
	RejectTimeout = "timeout"
)
