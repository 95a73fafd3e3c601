package kloud

// The web login (passwords, sessions, OpenID Connect single sign-on) is kloud/login; this file
// is its wiring (what it asks of kloud: users, the audit log) and the plain-HTTP helpers the
// other handlers of this package share with it (kloud/kloudhttp).

import (
	"context"
	"errors"
	"net/http"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/login"
	"github.com/kloud-dev/kloud/kloud/model"
)

// SessionCookie is the name of the browser's session cookie.
const SessionCookie = kloudhttp.SessionCookie

// SSO paths (kloud/login).
const (
	SSOLoginPath    = login.SSOLoginPath
	SSOCallbackPath = login.SSOCallbackPath
)

// SSOOptions configure single sign-on (kloud/login; kloud serve --oidc-*). An empty Issuer
// turns it off.
type SSOOptions = login.SSOOptions

// DefaultSSOScopes are the scopes requested unless SSOOptions.Scopes says otherwise.
func DefaultSSOScopes() []string { return login.DefaultSSOScopes() }

// DefaultSSOGroupsClaim is the claim teams are read from.
const DefaultSSOGroupsClaim = login.DefaultSSOGroupsClaim

// LoginRequest is the body of POST /api/login; LoginResponse its answer (and GET /api/session's).
type (
	LoginRequest  = login.LoginRequest
	LoginResponse = login.LoginResponse
)

// newLogin is the web login over this server's store, users, kontrol and audit log.
func newLogin(s *Server) (*login.Service, error) {
	return login.New(login.Options{
		PublicURL: s.opts.PublicURL, Browser: s.opts.Browser, SSO: s.opts.SSO, Store: s.store,
		Users: loginDeps{s}, Audit: loginDeps{s},
		Signer: s.Kontrol.Signer(), Verifier: s.Kontrol.Verifier(), Revocations: s.revs, Conns: s.Kite,
		Logger: s.log,
	})
}

// loginDeps is what kloud/login asks of kloud: users (users.go) and the audit log (audit.go).
type loginDeps struct{ s *Server }

// CheckPassword verifies a password. Unknown users and users without a password cost the same
// hash as a wrong password.
func (d loginDeps) CheckPassword(ctx context.Context, username, password string) (*model.User, bool) {
	u, err := d.s.loadUser(ctx, username)
	if err != nil || u.PasswordHash == "" || len(password) > api.MaxPasswordLen {
		if err != nil && !errors.Is(err, kite.ErrNotFound) {
			d.s.log.ErrorContext(ctx, "login: load user", "user", username, "err", err)
		}
		checkPasswordHash(dummyHash(), password)
		return nil, false
	}
	return u, checkPasswordHash(u.PasswordHash, password)
}

// UserExists is userExists.
func (d loginDeps) UserExists(ctx context.Context, username string) (bool, error) {
	return d.s.userExists(ctx, username)
}

// SetMember is setMember.
func (d loginDeps) SetMember(ctx context.Context, team, username, role string) error {
	return d.s.setMember(ctx, team, username, role)
}

// AuditLogin records web.login (target "sso" for single sign-on).
func (d loginDeps) AuditLogin(r *http.Request, user, via string, status int) {
	d.s.audits.addHTTP(r, auditWebLogin, user, via, status)
}

// AuditLogout records web.logout.
func (d loginDeps) AuditLogout(r *http.Request, user string) {
	d.s.audits.addHTTP(r, auditWebLogout, user, "", http.StatusOK)
}

// LoginName is the audit log's loginName.
func (d loginDeps) LoginName(ctx context.Context, name string) string {
	return d.s.audits.loginName(ctx, name)
}

// The plain-HTTP helpers of this package's handlers (kloud/kloudhttp).

func writeJSON(w http.ResponseWriter, code int, v any) { kloudhttp.WriteJSON(w, code, v) }

func writeError(w http.ResponseWriter, code int, msg string) { kloudhttp.WriteError(w, code, msg) }

func clientIP(r *http.Request) string { return kloudhttp.ClientIP(r) }

func requestSession(r *http.Request) string { return kloudhttp.RequestSession(r) }
