package kloud_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kontrol"
)

// agentCallable is all a machine agent may call on kloud's kite (kloud's own methods and the
// kontrol it hosts): register its own kite, fetch kontrol's public keys, and the kite built-ins.
// Adding a method here is a security decision.
var agentCallable = []string{
	"kontrol.register", "kontrol.getKey",
	"kite.ping", "kite.handshake", // public
}

// agentKeys returns, for a machine of owner, the key kloud now gives a machine and the kind of
// key kloud gave machines before agent keys had a kind (a kite key whose jti is the agent id).
func agentKeys(t *testing.T, e *kloudtest.Env, owner string) map[string]string {
	t.Helper()
	newKey, _, err := e.Server.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: owner, MachineID: "m-" + owner, StackID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	oldKey, _, err := e.Server.Kontrol.CreateKey(owner, kloud.AgentKitePrefix+"old-"+owner)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"agent key": newKey, "pre-agent-kind key": oldKey}
}

// TestAgentKeyRefusedByEveryKloudMethod is generated from the methods kloud's kite serves (every
// kloud area's methods and kontrol's): an agent key of an admin-owned machine — new kind, and a
// key minted before the change — gets -32002 from every method but its own agent calls, and
// those work.
func TestAgentKeyRefusedByEveryKloudMethod(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	methods := e.Server.Kite.Methods()
	if len(methods) < 30 {
		t.Fatalf("kloud serves only %d methods: %v", len(methods), methods)
	}
	for name, key := range agentKeys(t, e, kloud.Admin) {
		t.Run(name, func(t *testing.T) {
			// Presented as a kite key (what klient sends) and, the new kind, as a session (what
			// the CLI sends for a key that is not a kiteKey): the key's kind decides.
			types := []string{kite.AuthKiteKey}
			if name == "agent key" {
				types = append(types, kite.AuthSession)
			}
			for _, typ := range types {
				agent := e.DialAuth(kite.Auth{Type: typ, Key: key})
				n := 0
				for _, m := range methods {
					if slices.Contains(agentCallable, m) {
						continue
					}
					n++
					err := agent.Call(t.Context(), m, nil, nil)
					var ke *kite.Error
					if !errors.As(err, &ke) || ke.Code != kite.CodePermission || !strings.Contains(err.Error(), "agent keys may only register their own agent") {
						t.Errorf("%s (auth %s): %v, want -32002 agent keys may only register their own agent", m, typ, err)
					}
				}
				t.Logf("auth %s: %d methods refused", typ, n)
			}
			agent := e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: key})
			var keys kontrol.KeysResult
			if err := agent.Call(t.Context(), "kontrol.getKey", nil, &keys); err != nil || len(keys.Keys) == 0 {
				t.Fatalf("kontrol.getKey: %v", err)
			}
			var reg kontrol.RegisterResult
			if err := agent.Call(t.Context(), "kontrol.register", kontrol.RegisterParams{}, &reg); err != nil {
				t.Fatalf("kontrol.register: %v", err)
			}
			if id := reg.Kite.Kite; !strings.HasPrefix(id.ID, kloud.AgentKitePrefix) || id.Username != kloud.Admin {
				t.Fatalf("registered as %+v", id)
			}
		})
	}
}

// TestAgentKeyExploit is issue 9's bug 3 as a regression test, through the CLI: with the
// kite.key of a machine the admin owns, `kloud --key kite.key key create --username admin` and
// `kloud --key kite.key whoami` are refused (and write nothing), and no token for another of the
// owner's kites is to be had.
func TestAgentKeyExploit(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	dir := t.TempDir()
	run := func(key string, args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), append([]string{"--url", e.URL, "--key", key, "--data-dir", dir}, args...), &out, &errOut)
		return code, out.String() + errOut.String()
	}
	// The owner's other kite, which a token must not be minted for.
	adminKey, _, err := e.Server.Kontrol.CreateKey(kloud.Admin, "")
	if err != nil {
		t.Fatal(err)
	}
	other := e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: adminKey})
	kloudtest.Call(t, other, "kontrol.register", kontrol.RegisterParams{}, nil)

	for name, key := range agentKeys(t, e, kloud.Admin) {
		t.Run(name, func(t *testing.T) {
			keyFile := filepath.Join(t.TempDir(), "kite.key")
			if err := kitekey.WriteFile(keyFile, key); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "a.key")
			code, msg := run(keyFile, "key", "create", "--username", kloud.Admin, "--out", out)
			if code == 0 || !strings.Contains(msg, "agent keys may only register their own agent") {
				t.Errorf("key create with an agent key: exit %d\n%s", code, msg)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("key create with an agent key wrote %s (%v)", out, err)
			}
			code, msg = run(keyFile, "whoami")
			if code == 0 || strings.Contains(msg, "administrator") || !strings.Contains(msg, "agent keys may only register their own agent") {
				t.Errorf("whoami with an agent key: exit %d\n%s", code, msg)
			}
			agent := e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: key})
			for _, q := range []kite.Identity{{ID: other.Peer().ID}, {Username: kloud.Admin}} {
				err := agent.Call(t.Context(), "kontrol.getToken", kontrol.GetTokenParams{Query: q}, nil)
				if !errors.Is(err, kite.ErrPermission) {
					t.Errorf("getToken %+v with an agent key: %v", q, err)
				}
			}
		})
	}
	// The admin's own key still works (the CLI is fine, the key was the problem).
	adminFile := filepath.Join(t.TempDir(), "admin.key")
	if err := kitekey.WriteFile(adminFile, adminKey); err != nil {
		t.Fatal(err)
	}
	if code, msg := run(adminFile, "whoami"); code != 0 || !strings.Contains(msg, "admin") {
		t.Fatalf("whoami as admin: exit %d\n%s", code, msg)
	}
}

// TestShareReachesOnlyThatMachine: a user a machine is shared with gets tokens for that
// machine's agent only — not for the owner's other machines, not for the owner's other kites —
// and each token names exactly that one kite.
func TestShareReachesOnlyThatMachine(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	ctx := t.Context()
	addUsers(t, e, true, "alice", "bob")
	// Two machines of alice's with registered agents; m1 is shared with bob.
	ids := map[string]string{}
	for _, m := range []string{"m1", "m2"} {
		key, id, err := e.Server.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: "alice", MachineID: m, StackID: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		ids[m] = id
		agent := e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: key})
		kloudtest.Call(t, agent, "kontrol.register", kontrol.RegisterParams{}, nil)
		doc := model.Machine{ID: m, StackID: "s1", Label: m, Owner: "alice", Team: model.DefaultTeam, State: "Running", KiteID: id,
			CreatedAt: time.Now(), UpdatedAt: time.Now()}
		if m == "m1" {
			doc.Shares = []model.Share{{Username: "bob", Grant: model.GrantTerminal}}
		}
		if err := e.Server.Store().Machines().InsertMany(ctx, []model.Machine{doc}); err != nil {
			t.Fatal(err)
		}
	}
	aliceKite := e.Dial("alice")
	kloudtest.Call(t, aliceKite, "kontrol.register", kontrol.RegisterParams{}, nil)

	bob := e.Dial("bob")
	var tok kontrol.GetTokenResult
	kloudtest.Call(t, bob, "kontrol.getToken", kontrol.GetTokenParams{Query: kite.Identity{ID: ids["m1"]}}, &tok)
	c, err := e.Server.Kontrol.Verifier().Token(ctx, tok.Token, ids["m1"])
	if err != nil || c.Subject != "bob" || len(c.Audience) != 1 {
		t.Fatalf("bob's token for m1: %+v %v", c, err)
	}
	for _, q := range []kite.Identity{{ID: ids["m2"]}, {ID: aliceKite.Peer().ID}} {
		if err := bob.Call(ctx, "kontrol.getToken", kontrol.GetTokenParams{Query: q}, nil); !errors.Is(err, kite.ErrNotFound) {
			t.Errorf("bob's getToken %+v: %v, want not found", q, err)
		}
	}
	var res kontrol.QueryResult
	kloudtest.Call(t, bob, "kontrol.query", kontrol.QueryParams{Query: kite.Identity{}}, &res)
	if len(res.Kites) != 1 || res.Kites[0].Kite.ID != ids["m1"] {
		t.Fatalf("bob sees %+v, want only m1's agent", res.Kites)
	}
}

// TestOldKlientGetsTerminalSharesAsReadonly: a machine whose klient predates own-account shells
// (its klient.info lists no ownAccountShells) would give a terminal share the owner's account,
// so kloud pushes it terminal grants as readonly; a current klient gets them as they are.
func TestOldKlientGetsTerminalSharesAsReadonly(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	ctx := t.Context()
	for _, c := range []struct {
		name     string
		features []string
		want     string
	}{{"old klient", nil, model.GrantReadonly}, {"current klient", []string{"ownAccountShells"}, model.GrantTerminal}} {
		t.Run(c.name, func(t *testing.T) {
			mid := strings.ReplaceAll(c.name, " ", "-")
			key, id, err := e.Server.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: "alice", MachineID: mid, StackID: "s1"})
			if err != nil {
				t.Fatal(err)
			}
			doc := model.Machine{ID: mid, StackID: "s1", Label: mid, Owner: "alice", Team: model.DefaultTeam, State: "Running", KiteID: id,
				Shares: []model.Share{{Username: "bob", Grant: model.GrantTerminal}, {Username: "zoe", Grant: model.GrantFull}}, CreatedAt: time.Now(), UpdatedAt: time.Now()}
			if err := e.Server.Store().Machines().InsertMany(ctx, []model.Machine{doc}); err != nil {
				t.Fatal(err)
			}
			pushed := make(chan []model.Share, 1)
			k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "klient"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { k.Close() })
			k.HandleFunc("klient.info", func(context.Context, *kite.Request) (any, error) {
				return map[string]any{"kiteId": id, "features": c.features}, nil
			})
			k.HandleFunc("klient.setShares", func(_ context.Context, r *kite.Request) (any, error) {
				var p struct {
					Shares []model.Share `json:"shares"`
					Token  string        `json:"token"`
				}
				if err := r.Bind(&p); err != nil {
					return nil, err
				}
				pushed <- p.Shares
				return map[string]any{}, nil
			})
			conn, err := k.Dial(ctx, e.URL+"/kite", kite.Auth{Type: kite.AuthKiteKey, Key: key})
			if err != nil {
				t.Fatal(err)
			}
			kloudtest.Call(t, conn, "kontrol.register", kontrol.RegisterParams{}, nil)
			select {
			case sh := <-pushed:
				got := map[string]string{}
				for _, s := range sh {
					got[s.Username] = s.Grant
				}
				if got["bob"] != c.want || got["zoe"] != model.GrantFull {
					t.Fatalf("pushed %+v, want bob %s and zoe full", sh, c.want)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("kloud pushed no shares when the agent registered")
			}
		})
	}
}
