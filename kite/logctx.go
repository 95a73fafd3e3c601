package kite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
)

// RequestInfo identifies one served call (or HTTP request) in the logs: ID is made per call,
// Method is the kite method (or "GET /path"), User the caller's username ("" before the
// handshake, or not known yet).
type RequestInfo struct {
	ID, Method, User string
}

type requestInfoKey struct{}

// WithRequestInfo returns ctx carrying ri; every line logged with it through a LogHandler
// carries requestId, method and user.
func WithRequestInfo(ctx context.Context, ri RequestInfo) context.Context {
	return context.WithValue(ctx, requestInfoKey{}, ri)
}

// RequestInfoFrom returns the RequestInfo of ctx, if it has one.
func RequestInfoFrom(ctx context.Context) (RequestInfo, bool) {
	ri, ok := ctx.Value(requestInfoKey{}).(RequestInfo)
	return ri, ok
}

// NewRequestID returns a fresh request id: 16 hex digits.
func NewRequestID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// LogHandler wraps h so that a record logged with the ctx of a served call (the ctx a handler
// gets; see WithRequestInfo) carries requestId, user and method. A record that has one of
// those keys itself (e.g. user=the user an administrator added) keeps its own.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ h slog.Handler }

func (l logHandler) Enabled(ctx context.Context, lv slog.Level) bool { return l.h.Enabled(ctx, lv) }

func (l logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ri, ok := RequestInfoFrom(ctx); ok {
		has := map[string]bool{}
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "requestId", "user", "method":
				has[a.Key] = true
			}
			return true
		})
		for _, a := range []slog.Attr{slog.String("requestId", ri.ID), slog.String("user", ri.User), slog.String("method", ri.Method)} {
			if !has[a.Key] && a.Value.String() != "" {
				r.AddAttrs(a)
			}
		}
	}
	return l.h.Handle(ctx, r)
}

func (l logHandler) WithAttrs(as []slog.Attr) slog.Handler { return logHandler{l.h.WithAttrs(as)} }
func (l logHandler) WithGroup(name string) slog.Handler    { return logHandler{l.h.WithGroup(name)} }
