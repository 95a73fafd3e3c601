package kite_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kloud-dev/kloud/kite"
)

// pwParams validates like kloud's params: a field's form is a field error, a password too short
// is about content and says so with a kite sentinel.
type pwParams struct {
	Name     string `json:"name"`
	Password string `json:"password"`
}

func (p *pwParams) Validate() error {
	if p.Name == "" {
		return errors.New("name is required")
	}
	if len(p.Password) < 8 {
		return fmt.Errorf("password: at least 8 characters: %w", kite.ErrInvalidParams)
	}
	return nil
}

// TestInvalidFieldIsOneKindOfInvalidParams: a malformed request (Bind's decoding or a Validate
// error without a sentinel) arrives as ErrInvalidField, a content error as ErrInvalidParams
// only; both are ErrInvalidParams, with code -32602, on both sides of the wire.
func TestInvalidFieldIsOneKindOfInvalidParams(t *testing.T) {
	e := newServer(t, nil)
	e.server.HandleFunc("add", func(_ context.Context, r *kite.Request) (any, error) {
		var p pwParams
		if err := r.Bind(&p); err != nil {
			return nil, err
		}
		return "ok", nil
	})
	e.server.HandleFunc("content", func(context.Context, *kite.Request) (any, error) {
		return nil, fmt.Errorf("template: main.tf:3: syntax error: %w", kite.ErrInvalidParams)
	})
	_, c := e.dial("alice")
	cases := []struct {
		method string
		params any
		field  bool
	}{
		{"add", map[string]any{"name": 3}, true},                               // wrong type
		{"add", map[string]any{"nme": "x"}, true},                              // unknown field
		{"add", map[string]any{"password": "long enough"}, true},               // Validate: missing
		{"add", map[string]any{"name": "x", "password": "short"}, false},       // Validate: content
		{"content", nil, false},                                                // a handler's content error
		{"add", map[string]any{"name": "x", "password": "long enough"}, false}, // no error
	}
	for _, tc := range cases {
		var out string
		err := c.Call(t.Context(), tc.method, tc.params, &out)
		if out == "ok" {
			if err != nil || tc.field {
				t.Errorf("%s %v: %q %v", tc.method, tc.params, out, err)
			}
			continue
		}
		if !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("%s %v: %v is no ErrInvalidParams", tc.method, tc.params, err)
		}
		if got := errors.Is(err, kite.ErrInvalidField); got != tc.field {
			t.Errorf("%s %v: %v: ErrInvalidField %v, want %v", tc.method, tc.params, err, got, tc.field)
		}
		var ke *kite.Error
		if !errors.As(err, &ke) || ke.Code != kite.CodeInvalidParams {
			t.Errorf("%s %v: %#v", tc.method, tc.params, err)
		}
	}
	// The same on this side of the wire, before ToWire.
	local := fmt.Errorf("x: %w", kite.ErrInvalidField)
	if !errors.Is(local, kite.ErrInvalidParams) || !errors.Is(local, kite.ErrInvalidField) {
		t.Error("a wrapped ErrInvalidField")
	}
	if errors.Is(fmt.Errorf("x: %w", kite.ErrInvalidParams), kite.ErrInvalidField) {
		t.Error("a wrapped ErrInvalidParams is an ErrInvalidField")
	}
}
