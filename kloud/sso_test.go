package kloud_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/kloud-dev/kloud/internal/oidctest"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
)

// The single sign-on tests run kloud against zitadel/oidc's example OpenID Provider (a real
// OP: its login form, its storage, RS256 ID tokens; internal/oidctest), and play the browser
// with a cookie jar: kloud's /api/oidc/login, the OP's login form, the redirect back to kloud's
// callback.

const ssoSecret = "kloud-client-secret"

type ssoEnv struct {
	t  *testing.T
	op *oidctest.Provider
	k  *kloudtest.Env
}

var ssoUsers = []oidctest.User{
	{ID: "sub-carol", Username: "carol@corp.example", Password: "carol-pass", Email: "carol@corp.example", Groups: []string{"devs", "no-such-team"}},
	{ID: "sub-dave", Username: "dave", Password: "dave-pass", Email: "dave@corp.example"},
	{ID: "sub-admin", Username: "admin", Password: "admin-pass"},
}

// newSSOEnv starts the OP and a kloud using it (client "kloud"), plus a second client "other"
// of the same OP.
func newSSOEnv(t *testing.T) *ssoEnv {
	op := oidctest.Listen(t, "")
	k := kloudtest.Start(t, kloudtest.Options{SSO: kloud.SSOOptions{Issuer: op.Issuer, ClientID: "kloud", ClientSecret: ssoSecret}})
	op.Serve(oidctest.Options{
		Clients: []oidctest.Client{
			{ID: "kloud", Secret: ssoSecret, RedirectURIs: []string{k.URL + kloud.SSOCallbackPath}},
			{ID: "other", Secret: "other-secret", RedirectURIs: []string{"http://127.0.0.1:1/callback"}},
		},
		Users: ssoUsers,
	})
	return &ssoEnv{t: t, op: op, k: k}
}

// ssoBrowser is a cookie jar that follows redirects until kloud's callback.
type ssoBrowser struct {
	t *testing.T
	c *http.Client
}

func newSSOBrowser(t *testing.T) *ssoBrowser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Jar: jar, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if req.URL.Path == kloud.SSOCallbackPath || req.URL.Host == "127.0.0.1:1" ||
			via[len(via)-1].URL.Path == kloud.SSOCallbackPath {
			return http.ErrUseLastResponse // the test decides what reaches the callback, and reads its answer
		}
		return nil
	}}
	return &ssoBrowser{t: t, c: c}
}

func (b *ssoBrowser) get(u string) (*http.Response, string) {
	b.t.Helper()
	res, err := b.c.Get(u)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

// loginAt fills the OP's form reached at startURL (kloud's /api/oidc/login, or the OP's
// authorize URL) and returns where the OP sends the browser back.
func (b *ssoBrowser) loginAt(startURL, user, password string) *url.URL {
	b.t.Helper()
	res, body := b.get(startURL)
	id := res.Request.URL.Query().Get("authRequestID")
	if res.StatusCode != http.StatusOK || id == "" || !strings.Contains(body, `name="password"`) {
		b.t.Fatalf("GET %s ended at %s (%d), not the OP's login form:\n%s", startURL, res.Request.URL, res.StatusCode, body)
	}
	form := url.Values{"id": {id}, "username": {user}, "password": {password}}
	res, err := b.c.PostForm(res.Request.URL.Scheme+"://"+res.Request.URL.Host+"/login/username", form)
	if err != nil {
		b.t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	loc, err := res.Location()
	if res.StatusCode != http.StatusFound || err != nil {
		b.t.Fatalf("the OP's login form answered %d (%v), not a redirect back", res.StatusCode, err)
	}
	return loc
}

// callback sends the browser to kloud's callback and returns the answer (not followed).
func (b *ssoBrowser) callback(u *url.URL) (*http.Response, string) {
	b.t.Helper()
	res, body := b.get(u.String())
	return res, body
}

// sessionUser returns the user of the session cookie kloud set, or "".
func (b *ssoBrowser) sessionUser(k *kloudtest.Env) string {
	b.t.Helper()
	res, body := b.get(k.URL + "/api/session")
	if res.StatusCode != http.StatusOK {
		return ""
	}
	var s kloud.LoginResponse
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		b.t.Fatal(err)
	}
	return s.Username
}

// ssoLogin is a whole login through kloud's button; it fails the test unless kloud set a session,
// and returns its user.
func (e *ssoEnv) ssoLogin(user, password string) string {
	e.t.Helper()
	b := newSSOBrowser(e.t)
	cb := b.loginAt(e.k.URL+kloud.SSOLoginPath, user, password)
	if cb.Path != kloud.SSOCallbackPath {
		e.t.Fatalf("the OP sent the browser to %s, not kloud's callback", cb)
	}
	res, body := b.callback(cb)
	if loc := res.Header.Get("Location"); res.StatusCode != http.StatusFound || loc != "/#/machines" {
		e.t.Fatalf("callback: %d, Location %q:\n%s", res.StatusCode, loc, body)
	}
	name := b.sessionUser(e.k)
	if name == "" {
		e.t.Fatal("no session after the callback")
	}
	return name
}

func (e *ssoEnv) users() map[string]api.UserView {
	e.t.Helper()
	l, err := e.k.Client("admin").UserList(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]api.UserView{}
	for _, u := range l.Users {
		out[u.Username] = u
	}
	return out
}

// TestSSOLogin: a first login creates the user (named from preferred_username's part before
// "@"), bound to the OP's subject, a member of the team its group names (a group naming no team
// is ignored); a second login is the same user, not a second one; a group gone from the claim
// takes the user out of the team single sign-on put it in, not out of one an admin added it to;
// the OP's "dave" and "admin" do not become kloud's local dave and admin (dave-2, admin-2).
func TestSSOLogin(t *testing.T) {
	t.Parallel()
	e := newSSOEnv(t)
	ctx := t.Context()
	admin := e.k.Client("admin")
	for _, team := range []string{"devs", "ops"} {
		if _, err := admin.TeamCreate(ctx, api.TeamCreateParams{Slug: team, Title: team}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.UserAdd(ctx, api.UserAddParams{Username: "dave", Password: "local-dave-pass", Team: "ops"}); err != nil {
		t.Fatal(err)
	}
	before := len(e.users())

	if got := e.ssoLogin("carol@corp.example", "carol-pass"); got != "carol" {
		t.Fatalf("first login: session of %q, want carol", got)
	}
	u := e.users()["carol"]
	if u.SSOIssuer != e.op.Issuer || u.Email != "carol@corp.example" || u.HasPassword {
		t.Fatalf("carol after her first login: %+v", u)
	}
	if u.Teams["devs"] != model.RoleMember || len(u.Teams) != 1 {
		t.Fatalf("carol's teams: %v, want devs (member) only", u.Teams)
	}
	if got := e.ssoLogin("carol@corp.example", "carol-pass"); got != "carol" {
		t.Fatalf("second login: session of %q, want carol", got)
	}
	if n := len(e.users()); n != before+1 {
		t.Fatalf("%d users after two logins of carol, want %d", n, before+1)
	}

	// A membership by hand stays; the group's goes with the group.
	if _, err := admin.TeamAddMember(ctx, api.TeamMemberParams{Team: "ops", Username: "carol"}); err != nil {
		t.Fatal(err)
	}
	e.op.SetGroups("sub-carol", []string{})
	e.ssoLogin("carol@corp.example", "carol-pass")
	if teams := e.users()["carol"].Teams; teams["devs"] != "" || teams["ops"] != model.RoleMember {
		t.Fatalf("carol's teams after devs left her groups: %v, want ops only", teams)
	}
	e.op.SetGroups("sub-carol", []string{"devs"})
	e.ssoLogin("carol@corp.example", "carol-pass")
	if teams := e.users()["carol"].Teams; teams["devs"] != model.RoleMember {
		t.Fatalf("carol's teams after devs came back: %v", teams)
	}

	// A binding whose user was replaced by a local one (removed from the store, and added again
	// by hand) does not sign in as it.
	if err := e.k.Server.Store().Identities().Insert(ctx, model.Identity{Issuer: e.op.Issuer, Subject: "sub-dave", Username: "dave"}); err != nil {
		t.Fatal(err)
	}
	b := newSSOBrowser(t)
	res, body := b.callback(b.loginAt(e.k.URL+kloud.SSOLoginPath, "dave", "dave-pass"))
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "not this identity") || b.sessionUser(e.k) != "" {
		t.Fatalf("an identity bound to the local dave: %d\n%s", res.StatusCode, body)
	}
	if err := e.k.Server.Store().Identities().Delete(ctx, e.op.Issuer, "sub-dave", "dave"); err != nil {
		t.Fatal(err)
	}

	// Names of local users are not taken over.
	if got := e.ssoLogin("dave", "dave-pass"); got != "dave-2" {
		t.Fatalf("the OP's dave got a session of %q, want dave-2", got)
	}
	if got := e.ssoLogin("admin", "admin-pass"); got != "admin-2" {
		t.Fatalf("the OP's admin got a session of %q, want admin-2", got)
	}
	us := e.users()
	if d := us["dave"]; !d.HasPassword || d.SSOIssuer != "" || d.Teams["ops"] != model.RoleMember {
		t.Fatalf("local dave changed: %+v", d)
	}
	if a := us["admin-2"]; a.Admin || a.Role != model.RoleUser {
		t.Fatalf("the OP's admin is a kloud admin: %+v", a)
	}
	// The local dave still logs in with his password, as himself.
	res, err := http.Post(e.k.URL+"/api/login", "application/json", strings.NewReader(`{"username":"dave","password":"local-dave-pass"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("local dave's password login: %d", res.StatusCode)
	}
}

// TestSSORefusesForgedCallbacks: a callback whose state is not the one this browser's cookie
// holds, one from a browser that started no sign-in, and one whose ID token carries another
// nonce (a code obtained for another flow) get no session and create no user.
func TestSSORefusesForgedCallbacks(t *testing.T) {
	t.Parallel()
	e := newSSOEnv(t)
	before := len(e.users())

	// Wrong state.
	b := newSSOBrowser(t)
	cb := b.loginAt(e.k.URL+kloud.SSOLoginPath, "carol@corp.example", "carol-pass")
	q := cb.Query()
	q.Set("state", "forged"+q.Get("state"))
	cb.RawQuery = q.Encode()
	res, body := b.callback(cb)
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "state does not match") {
		t.Fatalf("callback with another state: %d\n%s", res.StatusCode, body)
	}
	if u := b.sessionUser(e.k); u != "" {
		t.Fatalf("session of %q after a forged state", u)
	}

	// The provider's own refusal (the user declined) is shown as such.
	b = newSSOBrowser(t)
	res, _ = b.get(e.k.URL + kloud.SSOLoginPath)
	formID := res.Request.URL.Query().Get("authRequestID") // at the OP's form now; kloud's cookie is set
	ku, _ := url.Parse(e.k.URL + kloud.SSOCallbackPath + "?error=access_denied&error_description=user+declined")
	res, body = b.callback(ku)
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "access_denied") || formID == "" {
		t.Fatalf("callback with the provider's error: %d\n%s", res.StatusCode, body)
	}

	// Another browser (no flow cookie) sent to a valid callback URL: a login CSRF.
	b = newSSOBrowser(t)
	cb = b.loginAt(e.k.URL+kloud.SSOLoginPath, "carol@corp.example", "carol-pass")
	victim := newSSOBrowser(t)
	res, body = victim.callback(cb)
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "no sign-in was started") {
		t.Fatalf("callback in a browser that started no sign-in: %d\n%s", res.StatusCode, body)
	}

	// Another nonce: this browser's flow cookie says nonce-A; the OP was asked for nonce-B.
	tryNonce := func(cookieNonce, opNonce string) (*http.Response, string, *ssoBrowser) {
		b := newSSOBrowser(t)
		verifier := oauth2.GenerateVerifier()
		state := randomString(t)
		sealed, err := e.k.Server.SealSSOFlow(state, cookieNonce, verifier)
		if err != nil {
			t.Fatal(err)
		}
		ku, _ := url.Parse(e.k.URL + "/api/oidc/")
		b.c.Jar.SetCookies(ku, []*http.Cookie{{Name: kloud.SSOCookie, Value: sealed, Path: "/api/oidc/"}})
		conf := e.oauth2Config(t, "kloud", ssoSecret, e.k.URL+kloud.SSOCallbackPath)
		cb := b.loginAt(conf.AuthCodeURL(state, oidc.Nonce(opNonce), oauth2.S256ChallengeOption(verifier)), "dave", "dave-pass")
		res, body := b.callback(cb)
		return res, body, b
	}
	res, body, _ = tryNonce("nonce-A-"+randomString(t), "nonce-B-"+randomString(t))
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "nonce does not match") {
		t.Fatalf("callback with an ID token of another nonce: %d\n%s", res.StatusCode, body)
	}
	if n := len(e.users()); n != before {
		t.Fatalf("%d users after refused callbacks, want %d", n, before)
	}
	// The same browser-made flow with the matching nonce logs in: the refusals above are
	// about the state and the nonce, not about how the test drives the flow.
	n := "nonce-" + randomString(t)
	res, body, b = tryNonce(n, n)
	if res.StatusCode != http.StatusFound || b.sessionUser(e.k) == "" {
		t.Fatalf("callback with the right nonce: %d\n%s", res.StatusCode, body)
	}
}

// TestSSORefusesOtherAudienceAndIssuer: an ID token the same OP signed for another client, and
// one another OP signed for a client named like kloud's, are refused by kloud's check (the
// callback's), which passes the same OP's token for kloud's client with its nonce.
func TestSSORefusesOtherAudienceAndIssuer(t *testing.T) {
	t.Parallel()
	e := newSSOEnv(t)
	ctx := t.Context()
	raw, nonce := e.idToken(t, e.op, "other", "other-secret", "http://127.0.0.1:1/callback")
	if err := e.k.Server.VerifySSOToken(ctx, raw, nonce); err == nil || !strings.Contains(err.Error(), "audience") {
		t.Fatalf("ID token for client other: %v, want an audience error", err)
	}
	// The control: the same OP's token for kloud's client passes the same check.
	raw, nonce = e.idToken(t, e.op, "kloud", ssoSecret, e.k.URL+kloud.SSOCallbackPath)
	if err := e.k.Server.VerifySSOToken(ctx, raw, nonce); err != nil {
		t.Fatalf("ID token for kloud: %v", err)
	}
	if err := e.k.Server.VerifySSOToken(ctx, raw, "another-nonce"); err == nil {
		t.Fatal("ID token with another nonce passed")
	}
	// Another OP with a client "kloud" of the same secret.
	other := oidctest.Start(t, oidctest.Options{
		Clients: []oidctest.Client{{ID: "kloud", Secret: ssoSecret, RedirectURIs: []string{"http://127.0.0.1:1/callback"}}},
		Users:   ssoUsers,
	})
	raw, nonce = e.idToken(t, other, "kloud", ssoSecret, "http://127.0.0.1:1/callback")
	// (go-oidc checks the signature against kloud's provider's keys first, then the issuer.)
	if err := e.k.Server.VerifySSOToken(ctx, raw, nonce); err == nil {
		t.Fatal("ID token of another OP passed")
	} else {
		t.Logf("ID token of another OP: %v", err)
	}
}

func (e *ssoEnv) oauth2Config(t *testing.T, id, secret, redirect string) *oauth2.Config {
	return oauth2ConfigAt(t, e.op.Issuer, id, secret, redirect)
}

func oauth2ConfigAt(t *testing.T, issuer, id, secret, redirect string) *oauth2.Config {
	t.Helper()
	p, err := oidc.NewProvider(t.Context(), issuer)
	if err != nil {
		t.Fatal(err)
	}
	return &oauth2.Config{ClientID: id, ClientSecret: secret, Endpoint: p.Endpoint(), RedirectURL: redirect, Scopes: []string{oidc.ScopeOpenID}}
}

// idToken runs the authorization code flow at op as client id (carol logging in) and returns
// the raw ID token and its nonce.
func (e *ssoEnv) idToken(t *testing.T, op *oidctest.Provider, id, secret, redirect string) (raw, nonce string) {
	t.Helper()
	conf := oauth2ConfigAt(t, op.Issuer, id, secret, redirect)
	state, nonce := randomString(t), randomString(t)
	b := newSSOBrowser(t)
	cb := b.loginAt(conf.AuthCodeURL(state, oidc.Nonce(nonce)), "carol@corp.example", "carol-pass")
	if cb.Query().Get("state") != state || cb.Query().Get("code") == "" {
		t.Fatalf("the OP redirected to %s", cb)
	}
	tok, err := conf.Exchange(context.Background(), cb.Query().Get("code"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = tok.Extra("id_token").(string)
	if raw == "" {
		t.Fatal(errors.New("no id_token"))
	}
	return raw, nonce
}

func randomString(t *testing.T) string {
	b := make([]byte, 16)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// TestSSOConcurrentFirstLogins: five browsers of one new subject reach kloud's callback at once:
// one user is created, and every browser gets a session of it.
func TestSSOConcurrentFirstLogins(t *testing.T) {
	t.Parallel()
	e := newSSOEnv(t)
	before := len(e.users())
	var bs []*ssoBrowser
	var cbs []*url.URL
	for range 5 {
		b := newSSOBrowser(t)
		bs = append(bs, b)
		cbs = append(cbs, b.loginAt(e.k.URL+kloud.SSOLoginPath, "carol@corp.example", "carol-pass"))
	}
	codes := make([]int, len(bs))
	var wg sync.WaitGroup
	for i := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := bs[i].c.Get(cbs[i].String())
			if err == nil {
				codes[i] = res.StatusCode
				res.Body.Close()
			}
		}()
	}
	wg.Wait()
	for i, b := range bs {
		if codes[i] != http.StatusFound {
			t.Errorf("browser %d: callback %d", i, codes[i])
		} else if u := b.sessionUser(e.k); u != "carol" {
			t.Errorf("browser %d: session of %q", i, u)
		}
	}
	if n := len(e.users()); n != before+1 {
		t.Fatalf("%d users after 5 concurrent first logins, want %d", n, before+1)
	}
}

// TestSSOAnotherIssuer: after kloud is pointed at another provider, that provider's user with the
// same login name, email and even subject as an existing SSO user is another kloud user
// (carol-2): the binding is to (issuer, subject).
func TestSSOAnotherIssuer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func() (*ssoEnv, *oidctest.Provider) {
		op := oidctest.Listen(t, "")
		k := kloudtest.Start(t, kloudtest.Options{DataDir: dir, SSO: kloud.SSOOptions{Issuer: op.Issuer, ClientID: "kloud", ClientSecret: ssoSecret}})
		op.Serve(oidctest.Options{
			Clients: []oidctest.Client{{ID: "kloud", Secret: ssoSecret, RedirectURIs: []string{k.URL + kloud.SSOCallbackPath}}},
			Users:   ssoUsers,
		})
		return &ssoEnv{t: t, op: op, k: k}, op
	}
	a, opA := start()
	if got := a.ssoLogin("carol@corp.example", "carol-pass"); got != "carol" {
		t.Fatalf("carol at the first provider: %q", got)
	}
	a.k.Stop()
	b, opB := start()
	if got := b.ssoLogin("carol@corp.example", "carol-pass"); got != "carol-2" {
		t.Fatalf("carol (same sub) at another provider got a session of %q, want carol-2", got)
	}
	us := b.users()
	if us["carol"].SSOIssuer != opA.Issuer || us["carol-2"].SSOIssuer != opB.Issuer {
		t.Fatalf("users: carol %+v, carol-2 %+v", us["carol"], us["carol-2"])
	}
}

// TestSSOProviderDown: with the provider unreachable kloud starts, serves passwords, and the
// SSO button's target says the provider cannot be reached (502) instead of hanging or crashing.
func TestSSOProviderDown(t *testing.T) {
	t.Parallel()
	op := oidctest.Listen(t, "") // bound, never served: connections are refused once closed
	issuer := op.Issuer
	op.Close()
	k := kloudtest.Start(t, kloudtest.Options{SSO: kloud.SSOOptions{Issuer: issuer, ClientID: "kloud", ClientSecret: ssoSecret}})
	b := newSSOBrowser(t)
	res, body := b.get(k.URL + kloud.SSOLoginPath)
	if res.StatusCode != http.StatusBadGateway || !strings.Contains(body, "cannot reach its OpenID provider") {
		t.Fatalf("GET %s with the provider down: %d %s", kloud.SSOLoginPath, res.StatusCode, body)
	}
	if _, body := b.get(k.URL + "/api/login/methods"); !strings.Contains(body, issuer) {
		t.Fatalf("login methods: %s", body)
	}
}

// TestSSOOff: without --oidc-issuer the login methods name no SSO and its paths say it is off.
func TestSSOOff(t *testing.T) {
	t.Parallel()
	k := kloudtest.Start(t, kloudtest.Options{})
	b := newSSOBrowser(t)
	_, body := b.get(k.URL + "/api/login/methods")
	if strings.Contains(body, "sso") || !strings.Contains(body, `"password":true`) {
		t.Fatalf("login methods without SSO: %s", body)
	}
	res, body := b.get(k.URL + kloud.SSOLoginPath)
	if res.StatusCode != http.StatusNotFound || !strings.Contains(body, "--oidc-issuer") {
		t.Fatalf("GET %s without SSO: %d %s", kloud.SSOLoginPath, res.StatusCode, body)
	}
}
