package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider"
)

// The local machine service: what the unprivileged kloudlocal Terraform provider asks kloud's
// process (root) to do. kloud mounts it under tfprovider.APIPath (Provider.Handler); the API is
// documented in tfprovider/api.go.
//
// Authentication: "Authorization: Bearer <token>", a token from mintToken (ApplyTemplate), for one
// stack of this kloud instance. Authorization: create only with kloud_stack = the token's stack
// and kloud_machine one of the token's machine ids; read, retag and delete only of machines whose
// record says the token's stack (kloud_stack) and this kloud instance. A machine without an
// instance (made before instance ids existed) counts as this instance's when its stack is the
// token's: stack ids are random, so another kloud's stack cannot match.
const (
	maxBody     = 2 << 20 // a create request: user data and tags
	maxUserData = 1 << 20
	maxTags     = 64
	maxTagKey   = 128
	maxTagValue = 1024
	// maxPerMachine bounds the machines one kloud machine id may have at once (a replacement
	// with create_before_destroy has two for a moment).
	maxPerMachine = 2
)

var (
	hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)
	tagKeyRE   = regexp.MustCompile(`^[A-Za-z0-9_.:/-]+$`)
	idRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// httpError is an answer with a status.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) error {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

func (l *Local) handler() http.Handler {
	mux := http.NewServeMux()
	p := tfprovider.APIPath
	mux.HandleFunc("POST "+p+"machines", l.serve(l.createMachine))
	mux.HandleFunc("GET "+p+"machines/{id}", l.serve(l.readMachine))
	mux.HandleFunc("PUT "+p+"machines/{id}/tags", l.serve(l.tagMachine))
	mux.HandleFunc("DELETE "+p+"machines/{id}", l.serve(l.deleteMachine))
	mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, tfprovider.ErrorBody{Error: r.Method + " " + r.URL.Path + ": no such operation of the local machine service"})
	})
	return mux
}

// serve authenticates the request, runs fn and writes its answer or error as JSON.
func (l *Local) serve(fn func(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		c, err := l.authenticate(r)
		code, out := http.StatusOK, any(nil)
		if err == nil {
			code, out, err = fn(r.Context(), c, r)
		}
		if err != nil {
			var he *httpError
			if !errors.As(err, &he) {
				he = &httpError{code: http.StatusInternalServerError, msg: err.Error()}
			}
			stack := ""
			if c != nil {
				stack = c.Stack
			}
			l.log.Warn("local machine service: refused", "method", r.Method, "path", r.URL.Path, "stack", stack, "status", he.code, "err", he.msg)
			writeJSON(w, he.code, tfprovider.ErrorBody{Error: he.msg})
			return
		}
		if out == nil {
			w.WriteHeader(code)
			return
		}
		writeJSON(w, code, out)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func (l *Local) authenticate(r *http.Request) (*tokenClaims, error) {
	if l.m == nil {
		return nil, errorf(http.StatusServiceUnavailable, "local machines cannot run on this host: %v", l.merr)
	}
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return nil, errorf(http.StatusUnauthorized, "no token: want Authorization: Bearer <the stack's token>")
	}
	// Reads and deletes (refresh and destroy, long after the build) take an expired token of the
	// stack; creates and retags need a live one.
	c, err := l.parseToken(tok, r.Method == http.MethodGet || r.Method == http.MethodDelete)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, errorf(http.StatusUnauthorized, "token expired: it was valid for one stack build; build the stack again through kloud")
	case err != nil && strings.Contains(err.Error(), "kloud instance"):
		return nil, errorf(http.StatusForbidden, "%s", err)
	case err != nil:
		return nil, errorf(http.StatusUnauthorized, "invalid token: %s", err)
	}
	return c, nil
}

// decode reads a JSON body strictly: unknown fields and trailing data are errors.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errorf(http.StatusRequestEntityTooLarge, "request body over %d bytes", mbe.Limit)
		}
		return errorf(http.StatusBadRequest, "bad request body: %s", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errorf(http.StatusBadRequest, "bad request body: data after the JSON object")
	}
	return nil
}

func checkTags(tags map[string]string) error {
	if len(tags) > maxTags {
		return errorf(http.StatusBadRequest, "tags: %d, at most %d", len(tags), maxTags)
	}
	for k, v := range tags {
		if len(k) > maxTagKey || !tagKeyRE.MatchString(k) {
			return errorf(http.StatusBadRequest, "tag %q: keys are 1-%d of [A-Za-z0-9_.:/-]", k, maxTagKey)
		}
		if len(v) > maxTagValue {
			return errorf(http.StatusBadRequest, "tag %q: value over %d bytes", k, maxTagValue)
		}
	}
	return nil
}

func view(in sandbox.Info) tfprovider.Machine {
	m := tfprovider.Machine{ID: in.ID, Hostname: in.Hostname, State: string(in.State), MemoryMB: int64(in.MemoryMB), CPUs: in.CPUs, Tags: in.Tags}
	if in.IP.IsValid() {
		m.IPAddress = in.IP.String()
	}
	return m
}

// newID names a machine after its host name plus a random suffix, so a replacement never
// collides with the machine it replaces.
func newID(hostname string) string {
	b := make([]byte, 4)
	rand.Read(b)
	h := strings.ToLower(hostname)
	if len(h) > 40 {
		h = h[:40]
	}
	return strings.TrimRight(h, ".-") + "-" + hex.EncodeToString(b)
}

func (l *Local) createMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	var req tfprovider.CreateRequest
	if err := decode(r, &req); err != nil {
		return 0, nil, err
	}
	if len(req.Hostname) > 63 || !hostnameRE.MatchString(req.Hostname) {
		return 0, nil, errorf(http.StatusBadRequest, "hostname %q: letters, digits and '-' in dot-separated labels, at most 63 characters", req.Hostname)
	}
	if req.MemoryMB != 0 && (req.MemoryMB < 32 || req.MemoryMB > 1<<20) {
		return 0, nil, errorf(http.StatusBadRequest, "memory %d MiB: between 32 and %d, or 0 for no limit", req.MemoryMB, 1<<20)
	}
	if req.CPUs != 0 && (req.CPUs < 0.01 || req.CPUs > 1024) {
		return 0, nil, errorf(http.StatusBadRequest, "cpus %g: between 0.01 and 1024, or 0 for no limit", req.CPUs)
	}
	if len(req.UserData) > maxUserData {
		return 0, nil, errorf(http.StatusBadRequest, "user data: %d bytes, at most %d", len(req.UserData), maxUserData)
	}
	if err := checkTags(req.Tags); err != nil {
		return 0, nil, err
	}
	stack, mid := req.Tags[TagStack], req.Tags[TagMachine]
	if stack != c.Stack {
		return 0, nil, errorf(http.StatusForbidden, "tag %s = %q: this token is for stack %s only", TagStack, stack, c.Stack)
	}
	if !c.MayCreate(mid) {
		return 0, nil, errorf(http.StatusForbidden, "tag %s = %q: not a machine of this build of stack %s", TagMachine, mid, c.Stack)
	}
	m, err := l.creator(ctx)
	if err != nil {
		return 0, nil, err
	}
	all, err := m.List(ctx)
	if err != nil {
		return 0, nil, err
	}
	n := 0
	for _, in := range all {
		if in.Tags[TagStack] == stack && in.Tags[TagMachine] == mid {
			n++
		}
	}
	if n >= maxPerMachine {
		return 0, nil, errorf(http.StatusConflict, "machine %s of stack %s has %d local machines already; destroy them first", mid, stack, n)
	}
	spec := sandbox.Spec{
		ID: newID(req.Hostname), Hostname: req.Hostname, MemoryMB: int(req.MemoryMB), CPUs: req.CPUs,
		Tags: req.Tags, Instance: l.instance,
	}
	if req.UserData != "" {
		spec.UserData = []byte(req.UserData)
	}
	in, err := m.Create(ctx, spec)
	if err != nil {
		return 0, nil, err
	}
	l.log.Info("local machine service: created", "stack", stack, "machine", mid, "id", in.ID, "ip", in.IP)
	return http.StatusCreated, view(in), nil
}

// owned loads machine {id} and checks that it is the token's stack's and this instance's. An
// absent machine is (Info with StateAbsent, nil).
func (l *Local) owned(ctx context.Context, c *tokenClaims, r *http.Request) (sandbox.Info, error) {
	id := r.PathValue("id")
	if !idRE.MatchString(id) {
		return sandbox.Info{}, errorf(http.StatusBadRequest, "machine id %q: want 1-64 characters of [A-Za-z0-9._-]", id)
	}
	in, err := l.m.Info(ctx, id)
	if err != nil {
		return sandbox.Info{}, err
	}
	if in.State == sandbox.StateAbsent {
		return in, nil
	}
	if s := in.Tags[TagStack]; s != c.Stack {
		return sandbox.Info{}, errorf(http.StatusForbidden, "machine %s is not a machine of stack %s", id, c.Stack)
	}
	if in.Instance != l.instance && in.Instance != "" {
		return sandbox.Info{}, errorf(http.StatusForbidden, "machine %s belongs to another kloud instance", id)
	}
	return in, nil
}

func (l *Local) readMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	in, err := l.owned(ctx, c, r)
	if err != nil {
		return 0, nil, err
	}
	if in.State == sandbox.StateAbsent {
		return 0, nil, errorf(http.StatusNotFound, "machine %s does not exist", in.ID)
	}
	return http.StatusOK, view(in), nil
}

func (l *Local) tagMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	var req tfprovider.TagsRequest
	if err := decode(r, &req); err != nil {
		return 0, nil, err
	}
	if err := checkTags(req.Tags); err != nil {
		return 0, nil, err
	}
	in, err := l.owned(ctx, c, r)
	if err != nil {
		return 0, nil, err
	}
	if in.State == sandbox.StateAbsent {
		return 0, nil, errorf(http.StatusNotFound, "machine %s does not exist", in.ID)
	}
	if s := req.Tags[TagStack]; s != c.Stack {
		return 0, nil, errorf(http.StatusForbidden, "tag %s = %q: a machine of stack %s stays in it", TagStack, s, c.Stack)
	}
	if mid := req.Tags[TagMachine]; mid != in.Tags[TagMachine] && !c.MayCreate(mid) {
		return 0, nil, errorf(http.StatusForbidden, "tag %s = %q: not a machine of this build of stack %s", TagMachine, mid, c.Stack)
	}
	out, err := l.m.SetTags(ctx, in.ID, req.Tags)
	if errors.Is(err, sandbox.ErrNotFound) {
		return 0, nil, errorf(http.StatusNotFound, "machine %s does not exist", in.ID)
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, view(out), nil
}

func (l *Local) deleteMachine(ctx context.Context, c *tokenClaims, r *http.Request) (int, any, error) {
	in, err := l.owned(ctx, c, r)
	if err != nil {
		return 0, nil, err
	}
	if in.State == sandbox.StateAbsent {
		return http.StatusNoContent, nil, nil
	}
	if err := l.m.Destroy(ctx, in.ID); err != nil {
		return 0, nil, err
	}
	l.log.Info("local machine service: destroyed", "stack", c.Stack, "machine", in.Tags[TagMachine], "id", in.ID)
	return http.StatusNoContent, nil, nil
}
