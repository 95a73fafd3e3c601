package kite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Request is one call being served.
type Request struct {
	Method string
	Params json.RawMessage
	Conn   *Conn // the connection it arrived on: call back or open streams through it
}

// Username is the caller's authenticated username. On a connection this side dialed, it is the
// served kite's username.
func (r *Request) Username() string { return r.Conn.Username() }

// Principal is what the caller's credential proved.
func (r *Request) Principal() *Principal { return r.Conn.Principal() }

// Peer is the caller's identity.
func (r *Request) Peer() Identity { return r.Conn.Peer() }

// Validator is implemented by params types that check themselves after decoding. An error that
// wraps a kite sentinel keeps it (ErrInvalidParams for content, e.g. a password too short);
// others are field errors (ErrInvalidField).
type Validator interface{ Validate() error }

// Bind decodes the params strictly into v (unknown fields are an error) and runs v.Validate if
// v has one. Errors wrap ErrInvalidField (an ErrInvalidParams), or the sentinel v.Validate's
// error wraps, and say what is wrong.
func (r *Request) Bind(v any) error {
	p := bytes.TrimSpace(r.Params)
	if len(p) == 0 || bytes.Equal(p, []byte("null")) {
		p = []byte("{}")
	}
	if p[0] == '[' { // positional params: accept a one-element array holding the object
		var arr []json.RawMessage
		if err := json.Unmarshal(p, &arr); err != nil || len(arr) != 1 {
			return fmt.Errorf("%s: params must be one object: %w", r.Method, ErrInvalidField)
		}
		p = arr[0]
	}
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %s: %w", r.Method, err.Error(), ErrInvalidField)
	}
	if val, ok := v.(Validator); ok {
		if err := val.Validate(); err != nil {
			var ke *Error
			if errors.As(err, &ke) {
				return fmt.Errorf("%s: %w", r.Method, err)
			}
			return fmt.Errorf("%s: %s: %w", r.Method, err.Error(), ErrInvalidField)
		}
	}
	return nil
}

// Handler serves calls of one method.
type Handler interface {
	ServeKite(ctx context.Context, r *Request) (any, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, r *Request) (any, error)

// ServeKite calls f.
func (f HandlerFunc) ServeKite(ctx context.Context, r *Request) (any, error) { return f(ctx, r) }

var _ Handler = HandlerFunc(nil)

// Typed adapts a function taking decoded params P: the params are bound (strictly, with
// Validate) before fn runs.
func Typed[P any](fn func(ctx context.Context, r *Request, p *P) (any, error)) Handler {
	return HandlerFunc(func(ctx context.Context, r *Request) (any, error) {
		p := new(P)
		if err := r.Bind(p); err != nil {
			return nil, err
		}
		return fn(ctx, r, p)
	})
}
