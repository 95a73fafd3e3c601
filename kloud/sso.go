package kloud

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Single sign-on with OpenID Connect, beside passwords (web_api_login.go):
//
//	GET /api/login/methods  {password: true, sso: {url, issuer}?}: what the login page offers
//	GET /api/oidc/login     starts the authorization code flow: a fresh state, nonce and PKCE
//	                        verifier, sealed with the store's key into the short-lived
//	                        HttpOnly cookie kloud_oidc, and a redirect to the provider
//	GET /api/oidc/callback  the provider's redirect (PublicURL + SSOCallbackPath): checks the
//	                        state against the cookie, exchanges the code with the verifier,
//	                        verifies the ID token (signature, issuer, audience, expiry) and its
//	                        nonce, reads the userinfo claims, finds or creates the user, sets
//	                        the usual session cookie and redirects to the UI
//
// A user is bound to the provider's (issuer, subject) in the identities collection, never to a
// name or an email: a later login of that subject is that user, and no other subject (of this
// or another issuer) and no local user becomes it. The first login derives a username from
// preferred_username, else the email's local part, else the subject (ssoCandidates); a name
// already taken by any user (a local one, another subject's, a reserved one) is never reused:
// the next free one of name-2 … name-9 is taken, else "sso-" and a hash of the identity.
//
// Teams come from the groups claim (SSOOptions.GroupsClaim): a group naming an existing team
// makes the user a member at each login; a team that single sign-on added the user to
// (User.SSOTeams) and whose group is gone from the claim is left at the next login. Roles given
// by a team admin by hand are not touched, and a group naming no team is ignored.

// SSO paths.
const (
	SSOLoginPath    = "/api/oidc/login"
	SSOCallbackPath = "/api/oidc/callback"
	ssoCookie       = "kloud_oidc"
	ssoFlowTTL      = 10 * time.Minute
	ssoFlowAAD      = "kloud/oidc-flow"
)

// DefaultSSOScopes are the scopes requested unless SSOOptions.Scopes says otherwise.
func DefaultSSOScopes() []string { return []string{oidc.ScopeOpenID, "profile", "email"} }

// DefaultSSOGroupsClaim is the claim teams are read from.
const DefaultSSOGroupsClaim = "groups"

// SSOOptions configure single sign-on (kloud serve --oidc-*). An empty Issuer turns it off.
type SSOOptions struct {
	Issuer       string // the provider's issuer URL (discovery at Issuer/.well-known/openid-configuration)
	ClientID     string
	ClientSecret string
	// GroupsClaim names the claim (a list of strings, or one string) whose values that name a
	// kloud team make the user a member. Default DefaultSSOGroupsClaim ("groups").
	GroupsClaim string
	// Scopes requested; "openid" is added if missing. Default DefaultSSOScopes() (openid,
	// profile, email); add "groups" for providers that want it (Dex).
	Scopes []string
	// HTTPClient talks to the provider (discovery, keys, token, userinfo). Default: a client
	// with a 30 s timeout.
	HTTPClient *http.Client
}

// Enabled reports whether single sign-on is configured.
func (o SSOOptions) Enabled() bool { return o.Issuer != "" }

func (o *SSOOptions) defaults() error {
	if o.Issuer == "" {
		return nil
	}
	if !strings.HasPrefix(o.Issuer, "https://") && !strings.HasPrefix(o.Issuer, "http://") {
		return fmt.Errorf("kloud: --oidc-issuer %q: must be an http(s) URL", o.Issuer)
	}
	if o.ClientID == "" {
		return errors.New("kloud: --oidc-issuer needs --oidc-client-id")
	}
	if o.GroupsClaim == "" {
		o.GroupsClaim = DefaultSSOGroupsClaim
	}
	if len(o.Scopes) == 0 {
		o.Scopes = DefaultSSOScopes()
	}
	if !slices.Contains(o.Scopes, oidc.ScopeOpenID) {
		o.Scopes = append([]string{oidc.ScopeOpenID}, o.Scopes...)
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	return nil
}

// ssoHub serves single sign-on. The provider's discovery document is fetched at the first login
// (and again after a failure), so kloud starts while the provider is down.
type ssoHub struct {
	s    *Server
	o    SSOOptions
	mu   sync.Mutex
	prov *oidc.Provider
}

// ssoFlow is what the kloud_oidc cookie carries between the redirect and the callback.
type ssoFlow struct {
	State    string    `json:"state"`
	Nonce    string    `json:"nonce"`
	Verifier string    `json:"verifier"`
	Expires  time.Time `json:"expires"`
}

func (h *ssoHub) ctx(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, h.o.HTTPClient)
}

func (h *ssoHub) provider(ctx context.Context) (*oidc.Provider, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.prov != nil {
		return h.prov, nil
	}
	p, err := oidc.NewProvider(h.ctx(ctx), h.o.Issuer)
	if err != nil {
		return nil, fmt.Errorf("OpenID provider %s: %w", h.o.Issuer, err)
	}
	h.prov = p
	return p, nil
}

func (h *ssoHub) oauth2(p *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{
		ClientID: h.o.ClientID, ClientSecret: h.o.ClientSecret, Endpoint: p.Endpoint(),
		RedirectURL: h.s.opts.PublicURL + SSOCallbackPath, Scopes: h.o.Scopes,
	}
}

// verifier checks an ID token's signature, issuer, audience (our client id) and expiry.
func (h *ssoHub) verifier(p *oidc.Provider) *oidc.IDTokenVerifier {
	return p.Verifier(&oidc.Config{ClientID: h.o.ClientID})
}

func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// LoginMethods is the answer of GET /api/login/methods.
type LoginMethods struct {
	Password bool       `json:"password"`
	SSO      *SSOMethod `json:"sso,omitempty"`
}

// SSOMethod says where the login page's "Sign in with SSO" button goes.
type SSOMethod struct {
	URL    string `json:"url"`
	Issuer string `json:"issuer"`
}

func (s *Server) handleLoginMethods(w http.ResponseWriter, r *http.Request) {
	m := LoginMethods{Password: true}
	if s.sso != nil {
		m.SSO = &SSOMethod{URL: SSOLoginPath, Issuer: s.sso.o.Issuer}
	}
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) ssoOff(w http.ResponseWriter) bool {
	if s.sso == nil {
		appPage(w, http.StatusNotFound, "Single sign-on is off",
			errors.New("this kloud has no OpenID provider configured (kloud serve --oidc-issuer); log in with your password"))
		return true
	}
	return false
}

// handleSSOLogin starts a login at the provider.
func (s *Server) handleSSOLogin(w http.ResponseWriter, r *http.Request) {
	if s.ssoOff(w) {
		return
	}
	h := s.sso
	p, err := h.provider(r.Context())
	if err != nil {
		s.log.Error("sso: discovery", "err", err)
		appPage(w, http.StatusBadGateway, "Single sign-on is unavailable", fmt.Errorf("kloud cannot reach its OpenID provider (%s); try again later or log in with your password", h.o.Issuer))
		return
	}
	f := ssoFlow{Verifier: oauth2.GenerateVerifier(), Expires: time.Now().Add(ssoFlowTTL)}
	if f.State, err = randomToken(); err == nil {
		f.Nonce, err = randomToken()
	}
	var cookie string
	if err == nil {
		cookie, err = s.sealSSOFlow(f)
	}
	if err != nil {
		s.log.Error("sso: start", "err", err)
		appPage(w, http.StatusInternalServerError, "Single sign-on failed", errors.New("see kloud's log"))
		return
	}
	// Lax: the provider's redirect back is a cross-site top-level GET, which carries it.
	http.SetCookie(w, &http.Cookie{Name: ssoCookie, Value: cookie, Path: "/api/oidc/", MaxAge: int(ssoFlowTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: s.secureCookies(r)})
	u := h.oauth2(p).AuthCodeURL(f.State, oidc.Nonce(f.Nonce), oauth2.S256ChallengeOption(f.Verifier))
	http.Redirect(w, r, u, http.StatusFound)
}

func (s *Server) sealSSOFlow(f ssoFlow) (string, error) {
	b, err := json.Marshal(f)
	if err != nil {
		return "", err
	}
	sealed, err := s.store.Seal(b, []byte(ssoFlowAAD))
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sealed), nil
}

func (s *Server) openSSOFlow(v string) (ssoFlow, error) {
	var f ssoFlow
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err == nil {
		b, err = s.store.Open(b, []byte(ssoFlowAAD))
	}
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	if err != nil {
		return f, fmt.Errorf("sign-in cookie: %w", err)
	}
	if time.Now().After(f.Expires) {
		return f, errors.New("the sign-in took longer than 10 minutes")
	}
	return f, nil
}

// ssoError is a callback failure shown to the browser (msg) and logged (err).
type ssoError struct {
	code int
	msg  string
	err  error
}

func (e *ssoError) Error() string {
	if e.err == nil {
		return e.msg
	}
	return e.msg + ": " + e.err.Error()
}
func (e *ssoError) Unwrap() error { return e.err }

func ssoFail(code int, msg string, err error) error { return &ssoError{code: code, msg: msg, err: err} }

// handleSSOCallback finishes a login: the provider redirected the browser here with a code.
func (s *Server) handleSSOCallback(w http.ResponseWriter, r *http.Request) {
	if s.ssoOff(w) {
		return
	}
	// One use: the flow cookie goes whatever happens.
	http.SetCookie(w, &http.Cookie{Name: ssoCookie, Value: "", Path: "/api/oidc/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: s.secureCookies(r)})
	u, err := s.ssoCallback(r)
	if err != nil {
		var se *ssoError
		if !errors.As(err, &se) {
			se = &ssoError{code: http.StatusInternalServerError, msg: "see kloud's log", err: err}
		}
		s.log.Warn("sso login refused", "ip", clientIP(r), "err", err)
		s.auditHTTP(r, auditWebLogin, "", "sso", se.code)
		appPage(w, se.code, "Single sign-on failed", errors.New(se.msg+"; go back to kloud and sign in again"))
		return
	}
	if _, err := s.startSession(w, r, u); err != nil {
		s.log.Error("issue session", "user", u.Username, "err", err)
		appPage(w, http.StatusInternalServerError, "Single sign-on failed", errors.New("could not issue a session; see kloud's log"))
		return
	}
	s.log.Info("login", "user", u.Username, "ip", clientIP(r), "via", "sso", "issuer", s.sso.o.Issuer)
	s.auditHTTP(r, auditWebLogin, u.Username, "sso", http.StatusOK)
	http.Redirect(w, r, "/#/machines", http.StatusFound)
}

func (s *Server) ssoCallback(r *http.Request) (*User, error) {
	h := s.sso
	ctx := r.Context()
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		return nil, ssoFail(http.StatusUnauthorized, fmt.Sprintf("the identity provider said %q (%s)", e, q.Get("error_description")), nil)
	}
	c, err := r.Cookie(ssoCookie)
	if err != nil || c.Value == "" {
		return nil, ssoFail(http.StatusBadRequest, "no sign-in was started in this browser (or it expired)", nil)
	}
	f, err := s.openSSOFlow(c.Value)
	if err != nil {
		return nil, ssoFail(http.StatusBadRequest, "the sign-in cookie is not valid", err)
	}
	if st := q.Get("state"); st == "" || subtle.ConstantTimeCompare([]byte(st), []byte(f.State)) != 1 {
		return nil, ssoFail(http.StatusBadRequest, "the state does not match the sign-in this browser started", nil)
	}
	code := q.Get("code")
	if code == "" {
		return nil, ssoFail(http.StatusBadRequest, "the provider sent no code", nil)
	}
	p, err := h.provider(ctx)
	if err != nil {
		return nil, ssoFail(http.StatusBadGateway, "kloud cannot reach its OpenID provider", err)
	}
	tok, err := h.oauth2(p).Exchange(h.ctx(ctx), code, oauth2.VerifierOption(f.Verifier))
	if err != nil {
		return nil, ssoFail(http.StatusUnauthorized, "the provider refused the code", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return nil, ssoFail(http.StatusBadGateway, "the provider sent no ID token", nil)
	}
	claims, err := h.verify(ctx, p, raw, f.Nonce)
	if err != nil {
		return nil, err
	}
	// The userinfo endpoint has the profile claims many providers leave out of the ID token.
	if p.UserInfoEndpoint() != "" {
		ui, err := p.UserInfo(h.ctx(ctx), oauth2.StaticTokenSource(tok))
		if err != nil {
			return nil, ssoFail(http.StatusBadGateway, "the provider's userinfo endpoint failed", err)
		}
		if ui.Subject != claims.Subject {
			return nil, ssoFail(http.StatusUnauthorized, "the userinfo answer is about another subject", nil)
		}
		var extra map[string]any
		if err := ui.Claims(&extra); err == nil {
			for k, v := range extra {
				if _, ok := claims.all[k]; !ok {
					claims.all[k] = v
				}
			}
		}
	}
	return s.ssoUser(ctx, claims)
}

// ssoClaims is what kloud reads of a verified identity.
type ssoClaims struct {
	Issuer, Subject string
	all             map[string]any
}

func (c ssoClaims) str(k string) string {
	v, _ := c.all[k].(string)
	return v
}

// verify checks a raw ID token (signature, issuer, audience, expiry) and its nonce.
func (h *ssoHub) verify(ctx context.Context, p *oidc.Provider, raw, nonce string) (ssoClaims, error) {
	idt, err := h.verifier(p).Verify(h.ctx(ctx), raw)
	if err != nil {
		return ssoClaims{}, ssoFail(http.StatusUnauthorized, "the ID token is not valid for this kloud", err)
	}
	if nonce == "" || subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(nonce)) != 1 {
		return ssoClaims{}, ssoFail(http.StatusUnauthorized, "the ID token's nonce does not match this sign-in (a replayed token?)", nil)
	}
	c := ssoClaims{Issuer: idt.Issuer, Subject: idt.Subject, all: map[string]any{}}
	if err := idt.Claims(&c.all); err != nil {
		return ssoClaims{}, ssoFail(http.StatusBadGateway, "the ID token's claims do not decode", err)
	}
	if c.Subject == "" {
		return ssoClaims{}, ssoFail(http.StatusUnauthorized, "the ID token has no subject", nil)
	}
	return c, nil
}

// groups returns the groups claim: a list of strings, or one string.
func (c ssoClaims) groups(claim string) []string {
	switch v := c.all[claim].(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, g := range v {
			if s, ok := g.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// ssoUser returns the user bound to the identity, creating it at its first login, and brings
// its team memberships in line with the groups claim.
func (s *Server) ssoUser(ctx context.Context, c ssoClaims) (*User, error) {
	ids := s.store.Identities()
	var username string
	id, err := ids.Get(ctx, c.Issuer, c.Subject)
	switch {
	case err == nil:
		username = id.Username
	case errors.Is(err, store.ErrNotFound):
		if username, err = s.ssoCreate(ctx, c); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("look up identity: %w", err)
	}
	u, err := s.loadUser(ctx, username)
	if err != nil {
		return nil, ssoFail(http.StatusForbidden, fmt.Sprintf("the kloud user %q of this identity is gone; ask an administrator", username), err)
	}
	// A binding whose user was replaced (removed, and a local user of the name added) does not
	// sign in as the new one.
	if u.SSOIssuer != c.Issuer {
		return nil, ssoFail(http.StatusForbidden, fmt.Sprintf("the kloud user %q is not this identity's; ask an administrator", username), nil)
	}
	if err := s.ssoTeams(ctx, u, c.groups(s.sso.o.GroupsClaim)); err != nil {
		return nil, err
	}
	return u, nil
}

// ssoCreate creates the user of a first login and binds the identity to it. The binding is
// inserted first: of two concurrent first logins of one subject, one wins and the other uses
// its user.
func (s *Server) ssoCreate(ctx context.Context, c ssoClaims) (string, error) {
	ids := s.store.Identities()
	email := c.str("email")
	if len(email) > 254 || !strings.Contains(email, "@") || strings.ContainsAny(email, " \t\r\n") {
		email = ""
	}
	for _, name := range ssoCandidates(c) {
		if slices.Contains(api.ReservedUsernames(), name) {
			continue
		}
		taken, err := s.userExists(ctx, name)
		if err != nil {
			return "", err
		}
		if taken {
			continue
		}
		err = ids.Insert(ctx, store.Identity{Issuer: c.Issuer, Subject: c.Subject, Username: name})
		if errors.Is(err, store.ErrConflict) { // a concurrent first login bound it
			id, err := ids.Get(ctx, c.Issuer, c.Subject)
			if err != nil {
				return "", fmt.Errorf("look up identity: %w", err)
			}
			return id.Username, nil
		}
		if err != nil {
			return "", fmt.Errorf("bind identity: %w", err)
		}
		err = s.store.Users().Insert(ctx, User{Username: name, Email: email, SSOIssuer: c.Issuer, CreatedAt: s.store.Now()})
		if errors.Is(err, store.ErrConflict) { // the name was taken meanwhile: never take it over
			if err := ids.Delete(ctx, c.Issuer, c.Subject, name); err != nil {
				return "", err
			}
			continue
		}
		if err != nil {
			ids.Delete(ctx, c.Issuer, c.Subject, name)
			return "", fmt.Errorf("add user %s: %w", name, err)
		}
		s.log.Info("user added", "user", name, "by", "sso", "issuer", c.Issuer, "subject", c.Subject)
		return name, nil
	}
	return "", ssoFail(http.StatusConflict, "no free kloud username for this identity; ask an administrator", nil)
}

// ssoCandidates are the usernames a first login tries, in order: preferred_username, the
// email's local part, then name-2 … name-9 of the first of them that is a valid name, and last
// "sso-" and 12 hex digits of sha256(issuer " " subject).
func ssoCandidates(c ssoClaims) []string {
	var base string
	for _, v := range []string{c.str("preferred_username"), c.str("email"), c.str("nickname")} {
		if n := ssoName(v); n != "" {
			base = n
			break
		}
	}
	var out []string
	if base != "" {
		out = append(out, base)
		for i := 2; i <= 9; i++ {
			b := base
			if len(b) > 30 {
				b = strings.TrimRight(b[:30], "-")
			}
			out = append(out, fmt.Sprintf("%s-%d", b, i))
		}
	}
	sum := sha256.Sum256([]byte(store.IdentityID(c.Issuer, c.Subject)))
	return append(out, "sso-"+hex.EncodeToString(sum[:6]))
}

// ssoName makes a kloud username of a claim: the part before "@", lower case, runs of other
// characters than a-z and 0-9 as one "-", at most 32 characters, starting with a letter; ""
// if nothing valid is left.
func ssoName(v string) string {
	v, _, _ = strings.Cut(strings.ToLower(strings.TrimSpace(v)), "@")
	var b strings.Builder
	dash := false
	for _, r := range v {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			if b.Len() == 0 && r <= '9' {
				continue // must start with a letter
			}
			b.WriteRune(r)
			dash = false
		case b.Len() > 0 && !dash:
			b.WriteByte('-')
			dash = true
		}
	}
	n := strings.Trim(b.String(), "-")
	if len(n) > 32 {
		n = strings.TrimRight(n[:32], "-")
	}
	if api.CheckName("username", n) != nil {
		return ""
	}
	return n
}

// ssoTeams adds u to each team named by a group, and removes it from the teams single sign-on
// added it to whose group is gone. A membership made by hand is left alone, and so is a
// team admin's.
func (s *Server) ssoTeams(ctx context.Context, u *User, groups []string) error {
	want := map[string]bool{}
	for _, g := range groups {
		if api.CheckName("team", g) == nil {
			want[g] = true
		}
	}
	teams, err := s.store.Teams().OfMember(ctx, u.Username)
	if err != nil {
		return fmt.Errorf("load teams of %s: %w", u.Username, err)
	}
	member := map[string]string{}
	for _, t := range teams {
		for _, m := range t.Members {
			if m.Username == u.Username {
				member[t.Slug] = m.Role
			}
		}
	}
	var managed []string
	for _, t := range u.SSOTeams {
		switch {
		case want[t]:
			managed = append(managed, t)
		case member[t] == RoleMember:
			if err := s.setMember(ctx, t, u.Username, ""); err != nil && !errors.Is(err, store.ErrNotFound) {
				s.log.Warn("sso: leave team", "user", u.Username, "team", t, "err", err)
				managed = append(managed, t)
				continue
			}
			s.log.Info("team member removed", "team", t, "user", u.Username, "by", "sso (group gone)")
		}
	}
	for g := range want {
		if member[g] != "" {
			continue // a member already (maybe by hand): leave the role alone
		}
		if _, err := s.store.Teams().Get(ctx, g); err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("load team %s: %w", g, err)
			}
			continue // a group that names no team
		}
		if err := s.setMember(ctx, g, u.Username, RoleMember); err != nil {
			return fmt.Errorf("add %s to team %s: %w", u.Username, g, err)
		}
		s.log.Info("team member set", "team", g, "user", u.Username, "role", RoleMember, "by", "sso (group)")
		managed = append(managed, g)
	}
	slices.Sort(managed)
	managed = slices.Compact(managed)
	if !slices.Equal(managed, u.SSOTeams) {
		if err := s.store.Users().SetSSOTeams(ctx, u.Username, managed); err != nil {
			return err
		}
		u.SSOTeams = managed
	}
	return nil
}
