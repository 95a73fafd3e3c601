package kloud

import (
	"errors"
	"net/http"
	"strings"

	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/relay"
)

// HTTP handlers' authentication and errors, shared by kloud's HTTP routes (the relays'
// through relayDeps, relay.go; backup.go, metrics.go).

// httpError is an error with the HTTP status it answers.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// HTTPStatus is the status e answers (relay.Status reads it).
func (e *httpError) HTTPStatus() int { return e.code }

// httpCaller authenticates an HTTP request: a session (cookie or bearer) or a user's kite key
// (bearer). Machine agents' keys are refused.
func (s *Server) httpCaller(r *http.Request) (*Caller, error) {
	raw := requestSession(r)
	if raw == "" {
		return nil, &httpError{http.StatusUnauthorized, "not logged in: POST /api/login, or send Authorization: Bearer <session or kite key>"}
	}
	v := s.Kontrol.Verifier()
	sess, err := v.Session(r.Context(), raw)
	if err == nil {
		return s.callerByName(r.Context(), sess.Subject, sess.Admin)
	}
	if errors.Is(err, kitekey.ErrWrongKind) {
		kk, kerr := v.KiteKey(r.Context(), raw)
		if kerr == nil {
			if strings.HasPrefix(kk.ID, AgentKitePrefix) {
				return nil, &httpError{http.StatusForbidden, "machine agents may not open terminals"}
			}
			return s.callerByName(r.Context(), kk.Subject, false)
		}
		err = kerr
	}
	return nil, &httpError{http.StatusUnauthorized, "credential not accepted: " + err.Error()}
}

// writeErr answers err as JSON with the status it maps to.
func (s *Server) writeErr(w http.ResponseWriter, err error) {
	var he *httpError
	if errors.As(err, &he) {
		writeError(w, he.code, he.msg)
		return
	}
	code, err := errStatus(err)
	writeError(w, code, err.Error())
}

// errStatus is the HTTP status of an error that is not an httpError, and the error with its
// kite code (wireError).
func errStatus(err error) (int, error) {
	err = wireError(err)
	return relay.Status(err), err
}
