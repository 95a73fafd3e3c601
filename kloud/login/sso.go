package login

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
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

	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/model"
)

// Single sign-on with OpenID Connect, beside passwords (login.go):
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
	// SSOCookie is the sign-in flow's cookie, between the redirect and the callback.
	SSOCookie  = "kloud_oidc"
	ssoFlowTTL = 10 * time.Minute
	ssoFlowAAD = "kloud/oidc-flow"
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

// Defaults fills the unset fields of a configured single sign-on and checks the rest (kloud
// checks them at start, before anything else).
func (o *SSOOptions) Defaults() error {
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

func (s *Service) oauth2(p *oidc.Provider) *oauth2.Config {
	h := s.sso
	return &oauth2.Config{
		ClientID: h.o.ClientID, ClientSecret: h.o.ClientSecret, Endpoint: p.Endpoint(),
		RedirectURL: s.o.PublicURL + SSOCallbackPath, Scopes: h.o.Scopes,
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

// HandleMethods serves GET /api/login/methods.
func (s *Service) HandleMethods(w http.ResponseWriter, r *http.Request) {
	m := LoginMethods{Password: true}
	if s.sso != nil {
		m.SSO = &SSOMethod{URL: SSOLoginPath, Issuer: s.sso.o.Issuer}
	}
	kloudhttp.WriteJSON(w, http.StatusOK, m)
}

func (s *Service) ssoOff(w http.ResponseWriter) bool {
	if s.sso == nil {
		kloudhttp.Page(w, http.StatusNotFound, "Single sign-on is off",
			errors.New("this kloud has no OpenID provider configured (kloud serve --oidc-issuer); log in with your password"))
		return true
	}
	return false
}

// HandleSSOLogin serves GET /api/oidc/login: it starts a login at the provider.
func (s *Service) HandleSSOLogin(w http.ResponseWriter, r *http.Request) {
	if s.ssoOff(w) {
		return
	}
	h := s.sso
	p, err := h.provider(r.Context())
	if err != nil {
		s.log.Error("sso: discovery", "err", err)
		kloudhttp.Page(w, http.StatusBadGateway, "Single sign-on is unavailable", fmt.Errorf("kloud cannot reach its OpenID provider (%s); try again later or log in with your password", h.o.Issuer))
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
		kloudhttp.Page(w, http.StatusInternalServerError, "Single sign-on failed", errors.New("see kloud's log"))
		return
	}
	// Lax: the provider's redirect back is a cross-site top-level GET, which carries it.
	http.SetCookie(w, &http.Cookie{Name: SSOCookie, Value: cookie, Path: "/api/oidc/", MaxAge: int(ssoFlowTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: s.secureCookies(r)})
	u := s.oauth2(p).AuthCodeURL(f.State, oidc.Nonce(f.Nonce), oauth2.S256ChallengeOption(f.Verifier))
	http.Redirect(w, r, u, http.StatusFound)
}

func (s *Service) sealSSOFlow(f ssoFlow) (string, error) {
	b, err := json.Marshal(f)
	if err != nil {
		return "", err
	}
	sealed, err := s.o.Store.Seal(b, []byte(ssoFlowAAD))
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(sealed), nil
}

func (s *Service) openSSOFlow(v string) (ssoFlow, error) {
	var f ssoFlow
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err == nil {
		b, err = s.o.Store.Open(b, []byte(ssoFlowAAD))
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

// SealFlow seals a sign-in flow as the kloud_oidc cookie (SSOCookie) carries it between
// HandleSSOLogin and the callback; a test plays a browser with it (a flow whose nonce is not
// the ID token's).
func (s *Service) SealFlow(state, nonce, verifier string) (string, error) {
	return s.sealSSOFlow(ssoFlow{State: state, Nonce: nonce, Verifier: verifier, Expires: time.Now().Add(ssoFlowTTL)})
}

// VerifyIDToken checks a raw ID token as the callback does: signature, issuer, audience (this
// kloud's client id), expiry and nonce. Single sign-on must be on.
func (s *Service) VerifyIDToken(ctx context.Context, raw, nonce string) error {
	if s.sso == nil {
		return errors.New("single sign-on is off")
	}
	p, err := s.sso.provider(ctx)
	if err != nil {
		return err
	}
	_, err = s.sso.verify(ctx, p, raw, nonce)
	return err
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

// HandleSSOCallback serves GET /api/oidc/callback: it finishes a login; the provider
// redirected the browser here with a code.
func (s *Service) HandleSSOCallback(w http.ResponseWriter, r *http.Request) {
	if s.ssoOff(w) {
		return
	}
	// One use: the flow cookie goes whatever happens.
	http.SetCookie(w, &http.Cookie{Name: SSOCookie, Value: "", Path: "/api/oidc/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: s.secureCookies(r)})
	u, err := s.ssoCallback(r)
	if err != nil {
		var se *ssoError
		if !errors.As(err, &se) {
			se = &ssoError{code: http.StatusInternalServerError, msg: "see kloud's log", err: err}
		}
		s.log.Warn("sso login refused", "ip", kloudhttp.ClientIP(r), "err", err)
		s.o.Audit.AuditLogin(r, "", "sso", se.code)
		kloudhttp.Page(w, se.code, "Single sign-on failed", errors.New(se.msg+"; go back to kloud and sign in again"))
		return
	}
	if _, err := s.startSession(w, r, u); err != nil {
		s.log.Error("issue session", "user", u.Username, "err", err)
		kloudhttp.Page(w, http.StatusInternalServerError, "Single sign-on failed", errors.New("could not issue a session; see kloud's log"))
		return
	}
	s.log.Info("login", "user", u.Username, "ip", kloudhttp.ClientIP(r), "via", "sso", "issuer", s.sso.o.Issuer)
	s.o.Audit.AuditLogin(r, u.Username, "sso", http.StatusOK)
	http.Redirect(w, r, "/#/machines", http.StatusFound)
}

func (s *Service) ssoCallback(r *http.Request) (*model.User, error) {
	h := s.sso
	ctx := r.Context()
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		return nil, ssoFail(http.StatusUnauthorized, fmt.Sprintf("the identity provider said %q (%s)", e, q.Get("error_description")), nil)
	}
	c, err := r.Cookie(SSOCookie)
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
	tok, err := s.oauth2(p).Exchange(h.ctx(ctx), code, oauth2.VerifierOption(f.Verifier))
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
