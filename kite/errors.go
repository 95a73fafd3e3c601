package kite

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/sourcegraph/jsonrpc2"
)

// Error is a JSON-RPC error object as it travels on the wire. Data.Type names the kind of error.
// Errors received from a peer are *Error values; errors.Is(err, ErrNotFound) and friends compare
// codes, so callers can test received errors against the sentinels below.
type Error struct {
	Code    int64      `json:"code"`
	Message string     `json:"message"`
	Data    *ErrorData `json:"data,omitempty"`

	// refines marks a sentinel that is one kind of its code's errors (ErrInvalidField): it
	// matches only errors of its type.
	refines bool
}

// ErrorData is the data member of a kite error.
type ErrorData struct {
	Type    string `json:"type"`
	Details any    `json:"details,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// Is makes errors.Is match any *Error with the same code; a sentinel that refines its code
// (ErrInvalidField) matches only errors of its type as well.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (!t.refines || t.Type() == e.Type())
}

// Type returns Data.Type or "".
func (e *Error) Type() string {
	if e.Data == nil {
		return ""
	}
	return e.Data.Type
}

// Error codes of protocol v1 (docs/protocol.md).
const (
	CodeParse            = -32700
	CodeInvalidRequest   = -32600
	CodeMethodNotFound   = -32601
	CodeInvalidParams    = -32602
	CodeInternal         = -32603
	CodeAuth             = -32001
	CodePermission       = -32002
	CodeNotFound         = -32003
	CodeConflict         = -32004
	CodeState            = -32005
	CodeTimeout          = -32006
	CodeRateLimited      = -32007
	CodeTooLarge         = -32008
	CodeUnavailable      = -32009
	CodeStoreUnavailable = -32010
)

func sentinel(code int64, typ, msg string) *Error {
	return &Error{Code: code, Message: msg, Data: &ErrorData{Type: typ}}
}

// refinement is a sentinel for one kind of code's errors: errors.Is(err, it) needs its type,
// errors.Is(err, the code's sentinel) holds for it too.
func refinement(code int64, typ, msg string) *Error {
	e := sentinel(code, typ, msg)
	e.refines = true
	return e
}

// Sentinel errors. Handlers wrap them: fmt.Errorf("stack %q: %w", id, kite.ErrNotFound).
var (
	ErrParse          = sentinel(CodeParse, "parseError", "parse error")
	ErrInvalidRequest = sentinel(CodeInvalidRequest, "invalidRequest", "invalid request")
	ErrMethodNotFound = sentinel(CodeMethodNotFound, "methodNotFound", "no such method")
	ErrInvalidParams  = sentinel(CodeInvalidParams, "invalidParams", "invalid params")
	ErrInternal       = sentinel(CodeInternal, "internalError", "internal error")
	ErrAuth           = sentinel(CodeAuth, "authenticationError", "authentication failed")
	ErrPermission     = sentinel(CodePermission, "permissionDenied", "permission denied")
	ErrNotFound       = sentinel(CodeNotFound, "notFound", "not found")
	ErrConflict       = sentinel(CodeConflict, "conflict", "locked or conflict")
	ErrState          = sentinel(CodeState, "badState", "not allowed in this state")
	ErrTimeout        = sentinel(CodeTimeout, "timeout", "timeout")
	ErrRateLimited    = sentinel(CodeRateLimited, "rateLimited", "rate limited")
	ErrTooLarge       = sentinel(CodeTooLarge, "tooLarge", "too large")
	// ErrUnavailable: a service the call needs (e.g. kloud's terraformer) is down or
	// unreachable right now; the message says why. Trying again later may work.
	ErrUnavailable = sentinel(CodeUnavailable, "unavailable", "unavailable")
	// ErrStoreUnavailable: kloud's store (its database) does not answer right now; the message
	// gives the driver's cause. Trying again once the store is back works.
	ErrStoreUnavailable = sentinel(CodeStoreUnavailable, "storeUnavailable", "store unavailable")

	// ErrInvalidField: a field of the request is missing, of the wrong type or has a value the
	// method never takes (Request.Bind's decoding and Validate errors): the caller's request is
	// malformed, e.g. a command line's flag or argument. Other ErrInvalidParams errors are about
	// the content the request carries (a template, a password, a provider's rules). It is an
	// ErrInvalidParams (same code, type invalidField): errors.Is(err, ErrInvalidParams) holds.
	ErrInvalidField = refinement(CodeInvalidParams, "invalidField", "invalid field")
)

// ErrClosed is returned by calls on a connection that has closed.
var ErrClosed = errors.New("kite: connection closed")

// ErrNotSent marks a call whose request never fully left this side (the connection was closed
// or the write failed): the peer cannot have run it, so it may be sent again on a new
// connection (Client.Call does). Such errors also wrap ErrClosed.
var ErrNotSent = errors.New("request not sent")

// ToWire maps any handler error to the JSON-RPC error sent to the peer. It is the one place
// where Go errors become codes: a wrapped sentinel keeps its code and type with the full message;
// context deadline errors become timeouts; anything else is an internal error whose message is
// kept (handlers must not put secrets in errors).
func ToWire(err error) *jsonrpc2.Error {
	if err == nil {
		return nil
	}
	var ke *Error
	out := &Error{Code: CodeInternal, Message: err.Error(), Data: &ErrorData{Type: "internalError"}}
	switch {
	case errors.As(err, &ke):
		out.Code = ke.Code
		if ke.Data != nil {
			d := *ke.Data
			out.Data = &d
		}
	case errors.Is(err, context.DeadlineExceeded):
		out.Code, out.Data.Type = CodeTimeout, "timeout"
	case errors.Is(err, context.Canceled):
		out.Code, out.Data.Type = CodeTimeout, "cancelled"
	}
	we := &jsonrpc2.Error{Code: out.Code, Message: out.Message}
	we.SetError(out.Data)
	return we
}

// fromWire turns an error returned by jsonrpc2 into a *Error where possible.
func fromWire(err error) error {
	var je *jsonrpc2.Error
	if !errors.As(err, &je) {
		return err
	}
	out := &Error{Code: je.Code, Message: je.Message}
	if je.Data != nil {
		var d ErrorData
		if json.Unmarshal(*je.Data, &d) == nil {
			out.Data = &d
		}
	}
	return out
}
