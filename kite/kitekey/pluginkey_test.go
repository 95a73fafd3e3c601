package kitekey_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

func TestPluginKeySignVerify(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	// No TTL: no exp, like a kite key (revocable by jti).
	key, err := e.signer.PluginKey(kitekey.PluginKeySpec{Provider: "example"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.verifier.PluginKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if c.Provider != "example" || c.Subject != "provider:example" || !strings.HasPrefix(c.ID, kitekey.PluginIDPrefix) ||
		c.Kind != kitekey.KindPluginKey || c.ExpiresAt != nil || c.Issuer != issuer {
		t.Fatalf("claims %+v", c)
	}
	e.clock.Add(365 * 24 * time.Hour)
	if _, err := e.verifier.PluginKey(ctx, key); err != nil {
		t.Fatalf("a plugin key without exp stopped verifying: %v", err)
	}

	// With a TTL: valid until exp (plus leeway), then expired.
	key, err = e.signer.PluginKey(kitekey.PluginKeySpec{Provider: "example", KiteID: "plugin.k1", TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := e.verifier.PluginKey(ctx, key); err != nil || c.ID != "plugin.k1" || c.ExpiresAt == nil {
		t.Fatalf("%+v %v", c, err)
	}
	e.clock.Add(24*time.Hour + time.Minute)
	_, err = e.verifier.PluginKey(ctx, key)
	mustReject(t, err, kitekey.ErrExpired)

	// Bad specs.
	for _, s := range []kitekey.PluginKeySpec{
		{}, {Provider: "Example"}, {Provider: "a/b"}, {Provider: "x:y"}, {Provider: "9x"},
		{Provider: "ok", KiteID: "agent.x"}, {Provider: "ok", TTL: -time.Second},
	} {
		if _, err := e.signer.PluginKey(s); !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("spec %+v: %v, want invalid params", s, err)
		}
	}
}

func TestPluginKeyWrongKind(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	plugin, _ := e.signer.PluginKey(kitekey.PluginKeySpec{Provider: "example"})
	agent, _ := e.signer.AgentKey(agentSpec())
	kk, _ := e.signer.KiteKey("alice", "k1", "http://x/kite")
	sess, _ := e.signer.Session("alice", false, time.Hour)

	_, err := e.verifier.KiteKey(ctx, plugin)
	mustReject(t, err, kitekey.ErrWrongKind)
	_, err = e.verifier.AgentKey(ctx, plugin)
	mustReject(t, err, kitekey.ErrWrongKind)
	_, err = e.verifier.Session(ctx, plugin)
	mustReject(t, err, kitekey.ErrWrongKind)
	_, err = e.verifier.Token(ctx, plugin, "k1")
	mustReject(t, err, kitekey.ErrWrongKind)
	for name, raw := range map[string]string{"agent key": agent, "kite key": kk, "session": sess} {
		_, err := e.verifier.PluginKey(ctx, raw)
		if err == nil {
			t.Errorf("%s verified as a plugin key", name)
			continue
		}
		mustReject(t, err, kitekey.ErrWrongKind)
	}
}

// TestPluginKeyForged: claims the Signer would never produce, signed with the real key.
func TestPluginKeyForged(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	cur := e.ring.Current()
	now := e.clock.Now().Unix()
	for name, c := range map[string]struct {
		claims map[string]any
		want   error
	}{
		"sub mismatch":     {map[string]any{"sub": "provider:other", "provider": "example", "jti": "plugin.x"}, kitekey.ErrMissingClaim},
		"sub is a user":    {map[string]any{"sub": "alice", "provider": "example", "jti": "plugin.x"}, kitekey.ErrMissingClaim},
		"no provider":      {map[string]any{"sub": "provider:", "jti": "plugin.x"}, kitekey.ErrMissingClaim},
		"bad provider":     {map[string]any{"sub": "provider:a/b", "provider": "a/b", "jti": "plugin.x"}, kitekey.ErrMissingClaim},
		"agent jti":        {map[string]any{"sub": "provider:example", "provider": "example", "jti": "agent.x"}, kitekey.ErrMalformed},
		"expired":          {map[string]any{"sub": "provider:example", "provider": "example", "jti": "plugin.x", "exp": now - 3600}, kitekey.ErrExpired},
		"audience present": {map[string]any{"sub": "provider:example", "provider": "example", "jti": "plugin.x", "aud": "k1"}, kitekey.ErrWrongAudience},
	} {
		t.Run(name, func(t *testing.T) {
			cl := map[string]any{"iss": issuer, "iat": now, "kind": kitekey.KindPluginKey}
			for k, v := range c.claims {
				cl[k] = v
			}
			raw := rawJWT(t, map[string]any{"alg": "EdDSA", "kid": cur.ID, "typ": "JWT"}, cl, edSign(cur.Private))
			_, err := e.verifier.PluginKey(ctx, raw)
			mustReject(t, err, c.want)
		})
	}
}

func TestAuthenticatorPlugins(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	self := kite.Identity{ID: "kloud-1"}
	key, err := e.signer.PluginKey(kitekey.PluginKeySpec{Provider: "example", KiteID: "plugin.p1", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	kloud := &kitekey.Authenticator{Verifier: e.verifier, IsAdmin: func(string) bool { return true }, Agents: true, Plugins: true}
	kontrol := &kitekey.Authenticator{Verifier: e.verifier, IsAdmin: func(string) bool { return true }, Agents: true}
	for _, typ := range []string{kitekey.KindPluginKey, kite.AuthKiteKey, kite.AuthSession} {
		p, err := kloud.Authenticate(ctx, self, kite.Auth{Type: typ, Key: key})
		if err != nil {
			t.Fatalf("as %s: %v", typ, err)
		}
		want := kite.Principal{Username: "provider:example", Type: kitekey.KindPluginKey, KiteID: "plugin.p1", TokenID: "plugin.p1", Expires: e.clock.Now().Add(time.Hour)}
		if !p.Expires.Equal(want.Expires) {
			t.Errorf("as %s: expires %v, want %v", typ, p.Expires, want.Expires)
		}
		p.Expires = want.Expires
		if *p != want || !kitekey.IsPlugin(p) || kitekey.PluginName(p) != "example" || !kitekey.IsRestricted(p) || kitekey.IsAgent(p) {
			t.Errorf("as %s: principal %+v, want %+v (a plugin is never an admin)", typ, *p, want)
		}
		_, err = kontrol.Authenticate(ctx, self, kite.Auth{Type: typ, Key: key})
		mustReject(t, err, kitekey.ErrWrongKind)
		if err != nil && !strings.Contains(err.Error(), "accepted only by kloud") {
			t.Errorf("refusal does not say where plugin keys are accepted: %v", err)
		}
	}
	_, err = kloud.Authenticate(ctx, self, kite.Auth{Type: kite.AuthToken, Key: key})
	mustReject(t, err, kitekey.ErrWrongKind)
	// A user's kite key is not a plugin, even one whose id looks like a plugin's.
	kk, _ := e.signer.KiteKey("alice", "plugin.x", "http://x/kite")
	if p, err := kloud.Authenticate(ctx, self, kite.Auth{Type: kite.AuthKiteKey, Key: kk}); err != nil || kitekey.IsRestricted(p) || kitekey.PluginName(p) != "" {
		t.Fatalf("user kite key: %+v %v", p, err)
	}
	// An agent key still authenticates as an agent on kloud.
	ak, _ := e.signer.AgentKey(agentSpec())
	if p, err := kloud.Authenticate(ctx, self, kite.Auth{Type: kite.AuthKiteKey, Key: ak}); err != nil || !kitekey.IsAgent(p) || kitekey.IsPlugin(p) {
		t.Fatalf("agent key: %+v %v", p, err)
	}
}

// TestGate is the gate's table, over a real kite on loopback: who gets through a method opened to
// which kinds. Users always pass; a restricted principal passes only where its kind is allowed,
// and is told why not.
func TestGate(t *testing.T) {
	who := map[string]*kite.Principal{
		"user":   {Username: "alice", Type: kite.AuthSession},
		"admin":  {Username: "admin", Type: kite.AuthKiteKey, Admin: true},
		"agent":  {Username: "alice", Type: kitekey.KindAgentKey, KiteID: "agent.k1"},
		"plugin": {Username: "provider:example", Type: kitekey.KindPluginKey, KiteID: "plugin.p1"},
	}
	ok := kite.HandlerFunc(func(context.Context, *kite.Request) (any, error) { return "ok", nil })
	gates := []struct {
		name string
		h    kite.Handler
		pass []string // restricted principals that get through
	}{
		{"Gate()", kitekey.Gate(ok), nil},
		{"Gate(agent)", kitekey.Gate(ok, kitekey.KindAgentKey), []string{"agent"}},
		{"Gate(plugin)", kitekey.Gate(ok, kitekey.KindPluginKey), []string{"plugin"}},
		{"Gate(agent,plugin)", kitekey.Gate(ok, kitekey.KindAgentKey, kitekey.KindPluginKey), []string{"agent", "plugin"}},
		{"AgentGate(h,true)", kitekey.AgentGate(ok, true), []string{"agent"}},
		{"AgentGate(h,false)", kitekey.AgentGate(ok, false), nil},
		{"RefuseAgents", kitekey.RefuseAgents(ok), nil},
	}
	srv, err := kite.New(kite.Options{
		Identity: kite.Identity{Name: "gated"},
		// The principal is whatever the test names: this test is about the gate, not the keys.
		Authenticator: kite.AuthenticatorFunc(func(_ context.Context, _ kite.Identity, a kite.Auth) (*kite.Principal, error) {
			p := *who[a.Key]
			return &p, nil
		}),
		GateBuiltins: kitekey.RefuseAgents,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gates {
		srv.Handle("g."+g.name, g.h)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	cli, err := kite.New(kite.Options{Identity: kite.Identity{Name: "caller"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	for wname := range who {
		c, err := cli.Dial(t.Context(), hs.URL, kite.Auth{Type: "test", Key: wname})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range gates {
			want := wname == "user" || wname == "admin" || slices.Contains(g.pass, wname)
			var res string
			err := c.Call(t.Context(), "g."+g.name, nil, &res)
			switch {
			case want && (err != nil || res != "ok"):
				t.Errorf("%s, %s: %q %v, want through", g.name, wname, res, err)
			case !want && !errors.Is(err, kite.ErrPermission):
				t.Errorf("%s, %s: %q %v, want -32002", g.name, wname, res, err)
			case !want && wname == "plugin" && !strings.Contains(err.Error(), "plugin keys may only call the plugin-facing methods (this is the key of provider example)"):
				t.Errorf("%s, plugin: %v", g.name, err)
			case !want && wname == "agent" && !strings.Contains(err.Error(), "agent keys may only register their own agent"):
				t.Errorf("%s, agent: %v", g.name, err)
			}
		}
		// kite's gated built-ins refuse both restricted kinds.
		err = c.Call(t.Context(), "kite.methods", nil, nil)
		if restricted := wname == "agent" || wname == "plugin"; restricted != errors.Is(err, kite.ErrPermission) {
			t.Errorf("kite.methods, %s: %v", wname, err)
		}
		c.Close(nil)
	}
}
