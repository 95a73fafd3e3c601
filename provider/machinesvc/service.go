package machinesvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kloud-dev/kloud/provider/buildtoken"
	"github.com/kloud-dev/kloud/provider/machinesvc/tfmachine"
)

// Limits of a request to a machine service.
const (
	MaxBody     = 2 << 20 // a create request: user data and tags
	MaxTags     = 64
	MaxTagKey   = 128
	MaxTagValue = 1024
)

var tagKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.:/-]+$`)

// Op is one operation of a machine service: it answers with a status and a JSON body (nil: no
// body), or an error (an *HTTPError says its status; any other is a 500).
type Op func(ctx context.Context, c *buildtoken.Claims, r *http.Request) (int, any, error)

// Service is the HTTP side of a machine service: the API of package tfmachine under APIPath,
// every request authenticated with a build token (package buildtoken). The provider brings
// the four operations; Service routes, authenticates, limits bodies, logs refusals and writes
// answers.
type Service struct {
	// Kind names the service in messages and logs ("local": "local machine service").
	Kind    string
	APIPath string
	Log     *slog.Logger
	// Ready says why the service cannot work now (nil: it can): every request is then a 503
	// with its message.
	Ready func() error
	// ParseToken verifies a token: an expired one only with allowExpired (reads and deletes).
	ParseToken func(tok string, allowExpired bool) (*buildtoken.Claims, error)

	Create, Read, Tag, Delete Op
}

// Handler routes the service's API (tfmachine's client.go) to its operations.
func (s *Service) Handler() *http.ServeMux {
	mux := http.NewServeMux()
	p := s.APIPath
	mux.HandleFunc("POST "+p+"machines", s.serve(s.Create))
	mux.HandleFunc("GET "+p+"machines/{id}", s.serve(s.Read))
	mux.HandleFunc("PUT "+p+"machines/{id}/tags", s.serve(s.Tag))
	mux.HandleFunc("DELETE "+p+"machines/{id}", s.serve(s.Delete))
	mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusNotFound, tfmachine.ErrorBody{Error: r.Method + " " + r.URL.Path + ": no such operation of the " + s.Kind + " machine service"})
	})
	return mux
}

// serve authenticates the request, runs fn and writes its answer or error as JSON.
func (s *Service) serve(fn Op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, MaxBody)
		c, err := s.authenticate(r)
		code, out := http.StatusOK, any(nil)
		if err == nil {
			code, out, err = fn(r.Context(), c, r)
		}
		if err != nil {
			var he *HTTPError
			if !errors.As(err, &he) {
				he = &HTTPError{Code: http.StatusInternalServerError, Msg: err.Error()}
			}
			stack := ""
			if c != nil {
				stack = c.Stack
			}
			s.Log.Warn(s.Kind+" machine service: refused", "method", r.Method, "path", r.URL.Path, "stack", stack, "status", he.Code, "err", he.Msg)
			WriteJSON(w, he.Code, tfmachine.ErrorBody{Error: he.Msg})
			return
		}
		if out == nil {
			w.WriteHeader(code)
			return
		}
		WriteJSON(w, code, out)
	}
}

func (s *Service) authenticate(r *http.Request) (*buildtoken.Claims, error) {
	if err := s.Ready(); err != nil {
		return nil, Errorf(http.StatusServiceUnavailable, "%s", err)
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return nil, Errorf(http.StatusUnauthorized, "no token: want Authorization: Bearer <the stack's token>")
	}
	// Reads and deletes (refresh and destroy, long after the build) take an expired token of the
	// stack; creates and retags need a live one.
	c, err := s.ParseToken(tok, r.Method == http.MethodGet || r.Method == http.MethodDelete)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, Errorf(http.StatusUnauthorized, "token expired: it was valid for one stack build; build the stack again through kloud")
	case err != nil && strings.Contains(err.Error(), "kloud instance"):
		return nil, Errorf(http.StatusForbidden, "%s", err)
	case err != nil:
		return nil, Errorf(http.StatusUnauthorized, "invalid token: %s", err)
	}
	return c, nil
}

// HTTPError is an answer with a status.
type HTTPError struct {
	Code int
	Msg  string
}

func (e *HTTPError) Error() string { return e.Msg }

// Errorf returns an *HTTPError.
func Errorf(code int, format string, args ...any) error {
	return &HTTPError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// WriteJSON writes an answer (not cached).
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// Decode reads a JSON body strictly: unknown fields and trailing data are errors.
func Decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return Errorf(http.StatusRequestEntityTooLarge, "request body over %d bytes", mbe.Limit)
		}
		return Errorf(http.StatusBadRequest, "bad request body: %s", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Errorf(http.StatusBadRequest, "bad request body: data after the JSON object")
	}
	return nil
}

// CheckTags checks a machine's tags against the limits (MaxTags, MaxTagKey, MaxTagValue; keys
// of [A-Za-z0-9_.:/-]).
func CheckTags(tags map[string]string) error {
	if len(tags) > MaxTags {
		return Errorf(http.StatusBadRequest, "tags: %d, at most %d", len(tags), MaxTags)
	}
	for k, v := range tags {
		if len(k) > MaxTagKey || !tagKeyRE.MatchString(k) {
			return Errorf(http.StatusBadRequest, "tag %q: keys are 1-%d of [A-Za-z0-9_.:/-]", k, MaxTagKey)
		}
		if len(v) > MaxTagValue {
			return Errorf(http.StatusBadRequest, "tag %q: value over %d bytes", k, MaxTagValue)
		}
	}
	return nil
}
