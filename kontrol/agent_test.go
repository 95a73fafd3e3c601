package kontrol_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kontrol"
	"github.com/kloud-dev/kloud/kontrol/kontroltest"
)

// agentCallable is everything a machine agent may call on kontrol's kite: its own registration
// and kontrol's public keys (to verify the tokens presented to it), and the kite built-ins
// every kite serves to any authenticated peer. A method added to this list is a security
// decision: say in the review why an agent needs it.
var agentCallable = []string{
	"kontrol.register", "kontrol.getKey",
	"kite.ping", "kite.handshake", // public
}

// TestAgentKeyRefusedByEveryMethod is generated from kontrol's method table as registered on
// its kite: an agent key — the new kind, and a kite key minted for an agent before agent keys
// had a kind — gets -32002 "agent keys may only register their own agent" from every method
// that is not agent-facing, and its own calls work.
func TestAgentKeyRefusedByEveryMethod(t *testing.T) {
	e := kontroltest.Start(t, kontroltest.Options{})
	admin, _ := e.Dial(t.Context(), "admin", "cli")
	other, otherID := e.Dial(t.Context(), "admin", "klient") // the owner's other machine
	register(t, other)

	// Every row of the table is registered, and every registered method is in the table or a
	// kite built-in: nothing is served that the table does not decide about.
	table := map[string]bool{}
	for _, m := range e.Kontrol.Methods() {
		table[m.Name] = m.Agent
	}
	registered := e.Kite.Methods()
	for name := range table {
		if !slices.Contains(registered, name) {
			t.Errorf("%s is in kontrol's table but not registered", name)
		}
	}
	for _, name := range registered {
		if _, ok := table[name]; !ok && !strings.HasPrefix(name, "kite.") {
			t.Errorf("%s is registered but not in kontrol's method table", name)
		}
	}

	newKey, _ := e.AgentKey("admin", "m1")
	legacyKey, _, err := e.Kontrol.CreateKey("admin", "agent.legacy-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct{ name, key string }{{"agent key", newKey}, {"legacy agent kite key", legacyKey}} {
		t.Run(k.name, func(t *testing.T) {
			agent, err := e.DialKey(t.Context(), k.key, "klient")
			if err != nil {
				t.Fatal(err)
			}
			if p := agent.Peer(); p.Name != "kontrol" {
				t.Fatalf("peer %+v", p)
			}
			n := 0
			for _, name := range registered {
				if slices.Contains(agentCallable, name) {
					if table[name] != slices.Contains([]string{"kontrol.register", "kontrol.getKey"}, name) && !strings.HasPrefix(name, "kite.") {
						t.Errorf("%s: table says agent=%v", name, table[name])
					}
					continue
				}
				if table[name] {
					t.Errorf("%s is marked agent-callable in kontrol's table but not in this test's list", name)
				}
				n++
				// No params at all: the refusal comes before the params are looked at.
				err := agent.Call(t.Context(), name, nil, nil)
				var ke *kite.Error
				if !errors.As(err, &ke) || ke.Code != kite.CodePermission || !strings.Contains(err.Error(), "agent keys may only register their own agent") {
					t.Errorf("%s as an agent: %v, want -32002 agent keys may only register their own agent", name, err)
				}
			}
			if n < 6 {
				t.Fatalf("only %d methods checked", n)
			}
			// The exploit of issue 9 on kontrol: with the key of an admin-owned machine, no key
			// for admin, no token to the owner's other machine, no look at other kites.
			for _, c := range []struct {
				m string
				p any
			}{
				{"kontrol.createKey", kontrol.CreateKeyParams{Username: "admin"}},
				{"kontrol.getToken", kontrol.GetTokenParams{Query: kite.Identity{ID: otherID}}},
				{"kontrol.query", kontrol.QueryParams{Query: kite.Identity{}}},
				{"kontrol.revoke", kontrol.RevokeParams{JTI: otherID}},
			} {
				if err := agent.Call(t.Context(), c.m, c.p, nil); !errors.Is(err, kite.ErrPermission) {
					t.Errorf("%s as an agent: %v", c.m, err)
				}
			}
			// Its own calls work: kontrol's public keys, and registering its own kite under
			// the owner's name.
			var keys kontrol.KeysResult
			if err := agent.Call(t.Context(), "kontrol.getKey", nil, &keys); err != nil || len(keys.Keys) == 0 {
				t.Fatalf("kontrol.getKey as an agent: %v", err)
			}
			var res kontrol.RegisterResult
			if err := agent.Call(t.Context(), "kontrol.register", kontrol.RegisterParams{}, &res); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(res.Kite.Kite.ID, "agent.") || res.Kite.Kite.Username != "admin" {
				t.Fatalf("registered %+v", res.Kite.Kite)
			}
			if got := query(t, admin, kite.Identity{ID: res.Kite.Kite.ID}); len(got) != 1 {
				t.Fatalf("the agent's registration is not visible to the owner: %+v", got)
			}
		})
	}
	// Agent ids are kloud's to mint: the createKey RPC refuses them, even to an admin.
	if err := admin.Call(t.Context(), "kontrol.createKey", kontrol.CreateKeyParams{Username: "admin", KiteID: "agent.x"}, nil); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("createKey with an agent id: %v", err)
	}
}
