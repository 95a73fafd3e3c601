package kitekey_test

import (
	"context"
	"crypto/ed25519"
	"path/filepath"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
)

func agentSpec() kitekey.AgentKeySpec {
	return kitekey.AgentKeySpec{Owner: "alice", MachineID: "m1", StackID: "s1", KiteID: kitekey.AgentIDPrefix + "k1",
		KontrolURL: "http://10.200.0.1:7000/kite"}
}

func TestAgentKey(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	key, err := e.signer.AgentKey(agentSpec())
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.verifier.AgentKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject != "machine:m1" || c.ID != "agent.k1" || c.Owner != "alice" || c.MachineID != "m1" || c.StackID != "s1" ||
		c.Kind != kitekey.KindAgentKey || c.KontrolURL != "http://10.200.0.1:7000/kite" || c.ExpiresAt != nil {
		t.Fatalf("claims %+v", c)
	}
	// An agent key is no kite key, token or session, and none of them is an agent key.
	_, err = e.verifier.KiteKey(ctx, key)
	mustReject(t, err, kitekey.ErrWrongKind)
	_, err = e.verifier.Session(ctx, key)
	mustReject(t, err, kitekey.ErrWrongKind)
	kk, _ := e.signer.KiteKey("alice", "agent.k1", "http://x/kite")
	_, err = e.verifier.AgentKey(ctx, kk)
	mustReject(t, err, kitekey.ErrWrongKind)

	// The signer refuses what would make a confusing key.
	for name, f := range map[string]func(*kitekey.AgentKeySpec){
		"no owner":             func(a *kitekey.AgentKeySpec) { a.Owner = "" },
		"owner with colon":     func(a *kitekey.AgentKeySpec) { a.Owner = "machine:x" },
		"no machine":           func(a *kitekey.AgentKeySpec) { a.MachineID = "" },
		"kite id not an agent": func(a *kitekey.AgentKeySpec) { a.KiteID = "k1" },
		"no kontrol url":       func(a *kitekey.AgentKeySpec) { a.KontrolURL = "" },
	} {
		a := agentSpec()
		f(&a)
		if _, err := e.signer.AgentKey(a); err == nil {
			t.Errorf("%s: signed", name)
		}
	}

	// A well-signed agent-kind JWT whose sub does not name its machine, or whose jti is not an
	// agent's, is refused (forged with the real signing key: only the claims are wrong).
	kp := e.ring.Current()
	for name, claims := range map[string]map[string]any{
		"sub is a user": {"iss": issuer, "sub": "alice", "jti": "agent.k1", "iat": t0.Unix(), "kind": "agentKey", "owner": "alice", "machineId": "m1"},
		"jti not agent": {"iss": issuer, "sub": "machine:m1", "jti": "k1", "iat": t0.Unix(), "kind": "agentKey", "owner": "alice", "machineId": "m1"},
		"no owner":      {"iss": issuer, "sub": "machine:m1", "jti": "agent.k1", "iat": t0.Unix(), "kind": "agentKey", "machineId": "m1"},
	} {
		raw := rawJWT(t, map[string]any{"alg": "EdDSA", "kid": kp.ID, "typ": "JWT"}, claims, edSign(ed25519.PrivateKey(kp.Private)))
		if _, err := e.verifier.AgentKey(ctx, raw); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestAuthenticatorAgents: agent keys, and kite keys minted for agents before agent keys had
// their own kind, authenticate as agents (Type agentKey, the owner as username) only where
// Agents is set, whatever auth type they are presented as; elsewhere they are rejected.
func TestAuthenticatorAgents(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	self := kite.Identity{Name: "kontrol", ID: "kontrol-1"}
	key, err := e.signer.AgentKey(agentSpec())
	if err != nil {
		t.Fatal(err)
	}
	legacy, err := e.signer.KiteKey("alice", "agent.old", "http://x/kite")
	if err != nil {
		t.Fatal(err)
	}
	kontrol := &kitekey.Authenticator{Verifier: e.verifier, IsAdmin: func(string) bool { return true }, Agents: true}
	klient := &kitekey.Authenticator{Verifier: e.verifier}
	for _, c := range []struct {
		name, typ, key, id string
	}{
		{"agent key as kiteKey", kite.AuthKiteKey, key, "agent.k1"},
		{"agent key as agentKey", kitekey.KindAgentKey, key, "agent.k1"},
		{"agent key as session", kite.AuthSession, key, "agent.k1"},
		{"legacy agent kite key", kite.AuthKiteKey, legacy, "agent.old"},
	} {
		p, err := kontrol.Authenticate(ctx, self, kite.Auth{Type: c.typ, Key: c.key})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want := kite.Principal{Username: "alice", Type: kitekey.KindAgentKey, KiteID: c.id, TokenID: c.id}
		if *p != want || !kitekey.IsAgent(p) {
			t.Errorf("%s: principal %+v, want %+v (an agent is never an admin)", c.name, *p, want)
		}
		_, err = klient.Authenticate(ctx, self, kite.Auth{Type: c.typ, Key: c.key})
		mustReject(t, err, kitekey.ErrWrongKind)
	}
	// An agent key is never a token.
	_, err = kontrol.Authenticate(ctx, self, kite.Auth{Type: kite.AuthToken, Key: key})
	mustReject(t, err, kitekey.ErrWrongKind)
	// A user's kite key is not an agent.
	kk, _ := e.signer.KiteKey("alice", "k2", "http://x/kite")
	if p, err := kontrol.Authenticate(ctx, self, kite.Auth{Type: kite.AuthKiteKey, Key: kk}); err != nil || kitekey.IsAgent(p) {
		t.Fatalf("user kite key: %+v %v", p, err)
	}
}

func TestAgentKeyFile(t *testing.T) {
	e := newEnv(t)
	key, err := e.signer.AgentKey(agentSpec())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kite.key")
	if err := kitekey.WriteFile(path, key); err != nil {
		t.Fatal(err)
	}
	got, err := kitekey.ReadFile(path)
	if err != nil || got != key {
		t.Fatalf("read back: %v", err)
	}
	kf, err := kitekey.ParseKeyFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if !kf.Agent() || kf.Owner != "alice" || kf.Subject != "machine:m1" || kf.KiteID != "agent.k1" || kf.MachineID != "m1" ||
		kf.StackID != "s1" || kf.KontrolURL != "http://10.200.0.1:7000/kite" || kf.Issuer != issuer {
		t.Fatalf("key file %+v", kf)
	}
	// ParseUnverified stays about kite keys.
	if _, err := kitekey.ParseUnverified(key); err == nil {
		t.Fatal("ParseUnverified read an agent key as a kite key")
	}
	user, _ := e.signer.KiteKey("bob", "k9", "http://x/kite")
	if kf, err := kitekey.ParseKeyFile(user); err != nil || kf.Agent() || kf.Owner != "bob" || kf.MachineID != "" {
		t.Fatalf("user key file %+v %v", kf, err)
	}
	legacy, _ := e.signer.KiteKey("bob", "agent.k9", "http://x/kite")
	if kf, err := kitekey.ParseKeyFile(legacy); err != nil || !kf.Agent() || kf.Owner != "bob" {
		t.Fatalf("legacy agent key file %+v %v", kf, err)
	}
	tok, _ := e.signer.Token("bob", "k9", 60e9)
	if _, err := kitekey.ParseKeyFile(tok); err == nil {
		t.Fatal("a token parsed as a key file")
	}
}
