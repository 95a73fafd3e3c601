package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
)

// Login for browsers and the CLI, over plain HTTP (a kite handshake needs a credential first):
//
//	POST /api/login   {username, password} → {session, username, admin, expiresAt}
//	                  and an HttpOnly, SameSite=Strict cookie kloud_session
//	POST /api/logout  revokes the session (cookie or "Authorization: Bearer <session>") and
//	                  clears the cookie
//	GET  /api/session the cookie's session: {session, username, admin, expiresAt}, so a page
//	                  can present it in its kite handshake (auth type "session")
//
// Single sign-on (OpenID Connect) is sso.go; it ends in the same session cookie.
//
// A session is a kitekey session JWT signed by kontrol. Failed logins are limited per
// username and client address; a wrong password and an unknown user get the same answer, after
// the same amount of work.

// SessionCookie is the name of the browser's session cookie.
const SessionCookie = "kloud_session"

// DefaultSessionTTL is how long a login lasts.
const DefaultSessionTTL = 12 * time.Hour

// Failed logins allowed per username and client address within loginWindow.
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

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (s *Server) handleLogin(l *loginLimiter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// JSON only: a cross-site HTML form cannot send it, so no login CSRF.
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, `send the credentials as JSON: Content-Type: application/json, body {"username": "...", "password": "..."}`)
			return
		}
		var req LoginRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxLoginBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, `body must be {"username": "...", "password": "..."}`)
			return
		}
		if req.Username == "" || req.Password == "" {
			writeError(w, http.StatusBadRequest, "username and password are required")
			return
		}
		ip := clientIP(r)
		key := req.Username + "\x00" + ip
		if wait := l.blocked(key); wait > 0 {
			secs := int(wait.Round(time.Second) / time.Second)
			if secs < 1 {
				secs = 1
			}
			w.Header().Set("Retry-After", fmt.Sprint(secs))
			writeError(w, http.StatusTooManyRequests,
				fmt.Sprintf("too many failed logins for %q from %s; try again in %d s", req.Username, ip, secs))
			return
		}
		u, ok := s.checkLogin(r.Context(), req.Username, req.Password)
		if !ok {
			l.fail(key)
			s.log.InfoContext(r.Context(), "login failed", "user", req.Username, "ip", ip)
			s.auditHTTP(r, auditWebLogin, s.auditLoginName(r.Context(), req.Username), "", http.StatusUnauthorized)
			writeError(w, http.StatusUnauthorized, "wrong username or password")
			return
		}
		l.reset(key)
		res, err := s.startSession(w, r, u)
		if err != nil {
			s.log.ErrorContext(r.Context(), "issue session", "user", u.Username, "err", err)
			writeError(w, http.StatusInternalServerError, "could not issue a session; see kloud's log")
			return
		}
		s.log.InfoContext(r.Context(), "login", "user", u.Username, "ip", ip)
		s.auditHTTP(r, auditWebLogin, u.Username, "", http.StatusOK)
		writeJSON(w, http.StatusOK, res)
	}
}

// startSession issues a session for u and sets it as the session cookie (password and single
// sign-on logins).
func (s *Server) startSession(w http.ResponseWriter, r *http.Request, u *User) (LoginResponse, error) {
	admin := u.Admin || u.Role == RoleOwner
	sess, err := s.Signer().Session(u.Username, admin, DefaultSessionTTL)
	if err != nil {
		return LoginResponse{}, err
	}
	c, err := s.Kontrol.Verifier().Session(r.Context(), sess)
	if err != nil {
		return LoginResponse{}, err
	}
	exp := c.ExpiresAt.Time
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: sess, Path: "/", Expires: exp, MaxAge: int(DefaultSessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secureCookies(r),
	})
	return LoginResponse{Session: sess, Username: u.Username, Admin: admin, ExpiresAt: exp.UTC()}, nil
}

// checkLogin verifies a password. Unknown users and users without a password cost the same
// hash as a wrong password.
func (s *Server) checkLogin(ctx context.Context, username, password string) (*User, bool) {
	u, err := s.loadUser(ctx, username)
	if err != nil || u.PasswordHash == "" || len(password) > api.MaxPasswordLen {
		if err != nil && !errors.Is(err, kite.ErrNotFound) {
			s.log.ErrorContext(ctx, "login: load user", "user", username, "err", err)
		}
		checkPasswordHash(dummyHash(), password)
		return nil, false
	}
	return u, checkPasswordHash(u.PasswordHash, password)
}

func (s *Server) secureCookies(r *http.Request) bool {
	return r.TLS != nil || strings.HasPrefix(s.opts.PublicURL, "https://")
}

// requestSession returns the session a request carries: "Authorization: Bearer", else the
// cookie.
func requestSession(r *http.Request) string {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(tok)
	}
	if c, err := r.Cookie(SessionCookie); err == nil {
		return c.Value
	}
	return ""
}

func (s *Server) handleLogout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.secureCookies(r)})
	raw := requestSession(r)
	if raw == "" {
		writeJSON(w, http.StatusOK, map[string]bool{"loggedOut": false})
		return
	}
	c, err := s.Kontrol.Verifier().Session(r.Context(), raw)
	if err != nil {
		// Expired, revoked or foreign: nothing to revoke.
		writeJSON(w, http.StatusOK, map[string]bool{"loggedOut": false})
		return
	}
	until := time.Now().Add(DefaultSessionTTL)
	if c.ExpiresAt != nil {
		until = c.ExpiresAt.Time
	}
	if err := s.revs.RevokeUntil(r.Context(), c.ID, until, "logout"); err != nil {
		s.log.ErrorContext(r.Context(), "logout: revoke session", "user", c.Subject, "err", err)
		writeError(w, http.StatusInternalServerError, "could not revoke the session; see kloud's log")
		return
	}
	for _, conn := range s.Kite.Conns() {
		if p := conn.Principal(); p != nil && p.Type == kite.AuthSession && p.TokenID == c.ID {
			conn.Close(errors.New("logged out"))
		}
	}
	s.log.InfoContext(r.Context(), "logout", "user", c.Subject)
	s.auditHTTP(r, auditWebLogout, c.Subject, "", http.StatusOK)
	writeJSON(w, http.StatusOK, map[string]bool{"loggedOut": true})
}

func (s *Server) handleSession(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		writeError(w, http.StatusUnauthorized, "not logged in: POST /api/login first")
		return
	}
	claims, err := s.Kontrol.Verifier().Session(r.Context(), c.Value)
	if err != nil {
		writeError(w, http.StatusUnauthorized, "session no longer valid: log in again")
		return
	}
	res := LoginResponse{Session: c.Value, Username: claims.Subject, Admin: claims.Admin}
	if claims.ExpiresAt != nil {
		res.ExpiresAt = claims.ExpiresAt.Time.UTC()
	}
	writeJSON(w, http.StatusOK, res)
}

// loginLimiter counts failed logins per key within a sliding window.
type loginLimiter struct {
	mu     sync.Mutex
	limit  int
	window time.Duration
	fails  map[string][]time.Time
	now    func() time.Time
}

// maxLimiterKeys bounds the limiter's memory; beyond it, expired keys are dropped.
const maxLimiterKeys = 100_000

func newLoginLimiter(limit int, window time.Duration) *loginLimiter {
	return &loginLimiter{limit: limit, window: window, fails: map[string][]time.Time{}, now: time.Now}
}

// recent drops failures older than the window and returns the rest (l.mu held).
func (l *loginLimiter) recent(key string, now time.Time) []time.Time {
	f := l.fails[key]
	i := 0
	for i < len(f) && now.Sub(f[i]) >= l.window {
		i++
	}
	f = f[i:]
	if len(f) == 0 {
		delete(l.fails, key)
		return nil
	}
	l.fails[key] = f
	return f
}

// blocked returns how long key must wait, or 0.
func (l *loginLimiter) blocked(key string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	f := l.recent(key, now)
	if len(f) < l.limit {
		return 0
	}
	return f[len(f)-l.limit].Add(l.window).Sub(now)
}

func (l *loginLimiter) fail(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if len(l.fails) >= maxLimiterKeys {
		for k := range l.fails {
			l.recent(k, now)
		}
	}
	f := l.recent(key, now)
	if len(f) >= l.limit { // keep only what decides
		f = f[len(f)-l.limit+1:]
	}
	l.fails[key] = append(f, now)
}

func (l *loginLimiter) reset(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.fails, key)
}
