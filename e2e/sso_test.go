package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kloud-dev/kloud/internal/oidctest"
)

// TestBrowserSSO is single sign-on as a new user meets it, in Chromium (e2e/browser/sso.mjs):
// a real OpenID Provider (zitadel/oidc's example OP, with its login form, on loopback; started by
// this test) where carol is in the groups "devs" and "no-such-team"; kloud serves with
// --oidc-issuer/--oidc-client-id/--oidc-client-secret-file and has a team devs. The login page
// shows "Sign in with SSO"; clicking it shows the OP's form; filling it lands in kloud's UI as
// carol (the part of her login name before "@"), connected, with devs on her Teams page. The
// whole login runs twice; kloud then has exactly one new user, carol, bound to the OP
// (ssoIssuer), a member of devs and of nothing else, without a password. Screenshots in
// $KLOUD_ARTIFACTS/TestBrowserSSO.
func TestBrowserSSO(t *testing.T) {
	node, script, out := browserPrereqs(t)
	op := oidctest.Listen(t, "")
	secret := filepath.Join(t.TempDir(), "oidc-secret")
	if err := os.WriteFile(secret, []byte("kloud-e2e-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "--oidc-issuer", op.Issuer, "--oidc-client-id", "kloud", "--oidc-client-secret-file", secret)
	op.Serve(oidctest.Options{
		Clients: []oidctest.Client{{ID: "kloud", Secret: "kloud-e2e-secret", RedirectURIs: []string{e.url() + "/api/oidc/callback"}}},
		Users: []oidctest.User{{ID: "c4r01-subject", Username: "carol@corp.example", Password: "carol-op-pass",
			Email: "carol@corp.example", Groups: []string{"devs", "no-such-team"}}},
	})
	e.run("team", "create", "devs")
	type userView struct {
		Username    string
		SSOIssuer   string
		HasPassword bool
		Teams       map[string]string
	}
	var before []userView
	e.runJSON(&before, "user", "list")

	runBrowserScript(t, e, node, script, out, "sso.mjs", nil,
		"KLOUD_SSO_ISSUER="+op.Issuer, "KLOUD_SSO_LOGIN=carol@corp.example", "KLOUD_SSO_PASSWORD=carol-op-pass",
		"KLOUD_SSO_USER=carol", "KLOUD_SSO_TEAM=devs")

	var after []userView
	e.runJSON(&after, "user", "list")
	if len(after) != len(before)+1 {
		t.Fatalf("users after two SSO logins: %+v (before: %+v)", after, before)
	}
	var carol *userView
	for i, u := range after {
		if u.Username == "carol" {
			carol = &after[i]
		}
	}
	if carol == nil || carol.SSOIssuer != op.Issuer || carol.HasPassword || len(carol.Teams) != 1 || carol.Teams["devs"] != "member" {
		t.Fatalf("carol after SSO: %+v", carol)
	}
	for _, f := range []string{"login.png", "provider-form.png", "signed-in.png", "teams.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
	}
}
