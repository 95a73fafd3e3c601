// Package login is kloud's web login: passwords and sessions over plain HTTP (a kite handshake
// needs a credential first) and single sign-on with OpenID Connect (sso.go), both ending in the
// same session cookie. It gets what it needs of kloud through Options (the store's
// repositories, small interfaces for users, sessions and the audit log, a logger), never kloud's
// Server.
//
// Start with New and Options, then the handlers below (kloud's routes.go mounts them):
//
//	POST /api/login   {username, password} → {session, username, admin, expiresAt}
//	                  and an HttpOnly, SameSite=Strict cookie kloud_session
//	POST /api/logout  revokes the session (cookie or "Authorization: Bearer <session>") and
//	                  clears the cookie
//	GET  /api/session the cookie's session: {session, username, admin, expiresAt}, so a page
//	                  can present it in its kite handshake (auth type "session")
//
// A session is a kitekey session JWT signed by kontrol. Failed logins are limited per
// username and client address, in the store (store.Attempts), so the limit holds across every
// kloud replica on it; a wrong password and an unknown user get the same answer, after the same
// amount of work.
package login

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// SessionCookie is the name of the browser's session cookie.
const SessionCookie = kloudhttp.SessionCookie

// DefaultSessionTTL is how long a login lasts.
const DefaultSessionTTL = 12 * time.Hour

// Failed logins allowed per username and client address within loginWindow (a window starts at
// the first failure; store.Attempts).
const (
	loginFailLimit = 5
	loginWindow    = time.Minute
	maxLoginBody   = 8 << 10
)

// LoginRequest is the body of POST /api/login.
type LoginRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// LoginResponse is the answer to a successful login (and of GET /api/session).
type LoginResponse struct {
	Session   string    `json:"session"`
	Username  string    `json:"username"`
	Admin     bool      `json:"admin,omitempty"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// Users is what the login asks of kloud's users.
type Users interface {
	// CheckPassword returns the user if password is username's; an unknown user, one without
	// a password and a wrong password cost the same work and all answer false.
	CheckPassword(ctx context.Context, username, password string) (*model.User, bool)
	// UserExists reports whether username is taken (a user, or a name kloud keeps for itself).
	UserExists(ctx context.Context, username string) (bool, error)
	// SetMember gives username role in team (role "": removes it from the team).
	SetMember(ctx context.Context, team, username, role string) error
}

// Auditor records logins and logouts in kloud's audit log.
type Auditor interface {
	// AuditLogin records a web login of user (via "" for a password, "sso") answered status.
	AuditLogin(r *http.Request, user, via string, status int)
	// AuditLogout records a logout.
	AuditLogout(r *http.Request, user string)
	// LoginName is the user a failed login names, as the audit log records it.
	LoginName(ctx context.Context, name string) string
}

// Signer signs sessions (kontrol's kitekey.Signer).
type Signer interface {
	Session(username string, admin bool, ttl time.Duration) (string, error)
}

// Verifier checks sessions (kontrol's kitekey.Verifier).
type Verifier interface {
	Session(ctx context.Context, raw string) (*kitekey.SessionClaims, error)
}

// Revoker revokes a session until it would have expired (kloud's revocations).
type Revoker interface {
	RevokeUntil(ctx context.Context, jti string, until time.Time, reason string) error
}

// Conns lists the live kite connections (kloud's kite), so a logout closes its session's.
type Conns interface {
	Conns() []*kite.Conn
}

// Options configure New. Every field but SSO and Logger is required.
type Options struct {
	// PublicURL is how users reach kloud: an https URL makes the cookies Secure, and the
	// provider's redirect comes back to PublicURL + SSOCallbackPath.
	PublicURL string
	// Browser: the session cookie's Secure, SameSite and Domain (kloudhttp.Browser; the zero
	// value: Secure over https, SameSite=Strict, host-only).
	Browser kloudhttp.Browser
	// SSO configures single sign-on (sso.go); an empty Issuer turns it off. New applies its
	// Defaults.
	SSO SSOOptions
	// Store: sealing the sign-in cookie, the identities, users and teams repositories.
	Store       *store.Store
	Users       Users
	Audit       Auditor
	Signer      Signer
	Verifier    Verifier
	Revocations Revoker
	Conns       Conns
	// Logger (nil: discard).
	Logger *slog.Logger
}

// Service serves the login routes.
type Service struct {
	o        Options
	log      *slog.Logger
	attempts *store.Attempts
	sso      *ssoHub // nil when off
}

// New returns the login service.
func New(o Options) (*Service, error) {
	if o.Store == nil || o.Users == nil || o.Audit == nil || o.Signer == nil || o.Verifier == nil || o.Revocations == nil || o.Conns == nil {
		return nil, errors.New("login: Options.Store, Users, Audit, Signer, Verifier, Revocations and Conns are required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := o.SSO.Defaults(); err != nil {
		return nil, err
	}
	s := &Service{o: o, log: o.Logger, attempts: o.Store.Attempts()}
	if o.SSO.Enabled() {
		s.sso = &ssoHub{o: o.SSO}
	}
	return s, nil
}

// HandleLogin serves POST /api/login.
func (s *Service) HandleLogin(w http.ResponseWriter, r *http.Request) {
	// JSON only: a cross-site HTML form cannot send it, so no login CSRF.
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		kloudhttp.WriteError(w, http.StatusUnsupportedMediaType, `send the credentials as JSON: Content-Type: application/json, body {"username": "...", "password": "..."}`)
		return
	}
	var req LoginRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxLoginBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		kloudhttp.WriteError(w, http.StatusBadRequest, `body must be {"username": "...", "password": "..."}`)
		return
	}
	if req.Username == "" || req.Password == "" {
		kloudhttp.WriteError(w, http.StatusBadRequest, "username and password are required")
		return
	}
	ip := kloudhttp.ClientIP(r)
	key := "login/" + req.Username + "\x00" + ip
	// The attempt is taken before the password is checked, so that replicas racing cannot let
	// more than loginFailLimit through in a window; a success gives it back (Reset).
	wait, err := s.attempts.Take(r.Context(), key, loginFailLimit, loginWindow)
	if err != nil {
		s.log.ErrorContext(r.Context(), "login: count the attempt", "user", req.Username, "err", err)
		kloudhttp.WriteError(w, http.StatusServiceUnavailable, "the store is unavailable; try again")
		return
	}
	if wait > 0 {
		secs := int(wait.Round(time.Second) / time.Second)
		if secs < 1 {
			secs = 1
		}
		w.Header().Set("Retry-After", fmt.Sprint(secs))
		kloudhttp.WriteError(w, http.StatusTooManyRequests,
			fmt.Sprintf("too many failed logins for %q from %s; try again in %d s", req.Username, ip, secs))
		return
	}
	u, ok := s.o.Users.CheckPassword(r.Context(), req.Username, req.Password)
	if !ok {
		s.log.InfoContext(r.Context(), "login failed", "user", req.Username, "ip", ip)
		s.o.Audit.AuditLogin(r, s.o.Audit.LoginName(r.Context(), req.Username), "", http.StatusUnauthorized)
		kloudhttp.WriteError(w, http.StatusUnauthorized, "wrong username or password")
		return
	}
	if err := s.attempts.Reset(r.Context(), key); err != nil {
		s.log.WarnContext(r.Context(), "login: forget the failed attempts", "user", req.Username, "err", err)
	}
	res, err := s.startSession(w, r, u)
	if err != nil {
		s.log.ErrorContext(r.Context(), "issue session", "user", u.Username, "err", err)
		kloudhttp.WriteError(w, http.StatusInternalServerError, "could not issue a session; see kloud's log")
		return
	}
	s.log.InfoContext(r.Context(), "login", "user", u.Username, "ip", ip)
	s.o.Audit.AuditLogin(r, u.Username, "", http.StatusOK)
	kloudhttp.WriteJSON(w, http.StatusOK, res)
}

// startSession issues a session for u and sets it as the session cookie (password and single
// sign-on logins).
func (s *Service) startSession(w http.ResponseWriter, r *http.Request, u *model.User) (LoginResponse, error) {
	admin := u.Admin || u.Role == model.RoleOwner
	sess, err := s.o.Signer.Session(u.Username, admin, DefaultSessionTTL)
	if err != nil {
		return LoginResponse{}, err
	}
	c, err := s.o.Verifier.Session(r.Context(), sess)
	if err != nil {
		return LoginResponse{}, err
	}
	exp := c.ExpiresAt.Time
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: sess, Path: "/", Expires: exp, MaxAge: int(DefaultSessionTTL / time.Second),
		HttpOnly: true, SameSite: s.o.Browser.SameSite(), Secure: s.secureCookies(r), Domain: s.o.Browser.CookieDomain,
	})
	return LoginResponse{Session: sess, Username: u.Username, Admin: admin, ExpiresAt: exp.UTC()}, nil
}

func (s *Service) secureCookies(r *http.Request) bool {
	return s.o.Browser.Secure(r, s.o.PublicURL)
}

// HandleLogout serves POST /api/logout.
func (s *Service) HandleLogout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: s.o.Browser.SameSite(), Secure: s.secureCookies(r), Domain: s.o.Browser.CookieDomain})
	raw := kloudhttp.RequestSession(r)
	if raw == "" {
		kloudhttp.WriteJSON(w, http.StatusOK, map[string]bool{"loggedOut": false})
		return
	}
	c, err := s.o.Verifier.Session(r.Context(), raw)
	if err != nil {
		// Expired, revoked or foreign: nothing to revoke.
		kloudhttp.WriteJSON(w, http.StatusOK, map[string]bool{"loggedOut": false})
		return
	}
	until := time.Now().Add(DefaultSessionTTL)
	if c.ExpiresAt != nil {
		until = c.ExpiresAt.Time
	}
	if err := s.o.Revocations.RevokeUntil(r.Context(), c.ID, until, "logout"); err != nil {
		s.log.ErrorContext(r.Context(), "logout: revoke session", "user", c.Subject, "err", err)
		kloudhttp.WriteError(w, http.StatusInternalServerError, "could not revoke the session; see kloud's log")
		return
	}
	for _, conn := range s.o.Conns.Conns() {
		if p := conn.Principal(); p != nil && p.Type == kite.AuthSession && p.TokenID == c.ID {
			conn.Close(errors.New("logged out"))
		}
	}
	s.log.InfoContext(r.Context(), "logout", "user", c.Subject)
	s.o.Audit.AuditLogout(r, c.Subject)
	kloudhttp.WriteJSON(w, http.StatusOK, map[string]bool{"loggedOut": true})
}

// HandleSession serves GET /api/session.
func (s *Service) HandleSession(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		kloudhttp.WriteError(w, http.StatusUnauthorized, "not logged in: POST /api/login first")
		return
	}
	claims, err := s.o.Verifier.Session(r.Context(), c.Value)
	if err != nil {
		kloudhttp.WriteError(w, http.StatusUnauthorized, "session no longer valid: log in again")
		return
	}
	res := LoginResponse{Session: c.Value, Username: claims.Subject, Admin: claims.Admin}
	if claims.ExpiresAt != nil {
		res.ExpiresAt = claims.ExpiresAt.Time.UTC()
	}
	kloudhttp.WriteJSON(w, http.StatusOK, res)
}
