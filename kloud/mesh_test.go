package kloud_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// meshEnv is two kloud replicas on one store server (kloud store serve): A builds the machine,
// whose klient registers with A; B shares A's store and secret key, and its public URL is A's,
// as if a load balancer had sent klient's attachments for B's tickets to A.
type meshEnv struct {
	*termEnv          // A, with the machine
	b        *termEnv // B: the same machine, seen from replica B
	bEnv     *kloudtest.Env
}

func newMeshEnv(t *testing.T) *meshEnv {
	t.Helper()
	mongo := storetest.Serve(t)
	const db = "mesh"
	dirA, dirB := t.TempDir(), t.TempDir()
	a := newTermEnvWith(t, kloudtest.Options{MongoURL: mongo, MongoDatabase: db, DataDir: dirA, ReplicaHeartbeat: 500 * time.Millisecond})
	key, err := os.ReadFile(filepath.Join(dirA, "secret.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirB, "secret.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	b := kloudtest.Start(t, kloudtest.Options{MongoURL: mongo, MongoDatabase: db, DataDir: dirB, PublicURL: a.URL, ReplicaHeartbeat: 500 * time.Millisecond})
	if a.Server.ReplicaID() == b.Server.ReplicaID() {
		t.Fatalf("two replicas with one id %s", a.Server.ReplicaID())
	}
	// B learns of the agent from the store (A writes its presence record in the background).
	testutil.Eventually(t, 30*time.Second, func() bool {
		r, err := b.Server.Store().Kites().Get(t.Context(), a.machine.KiteID)
		return err == nil && r.Replica == a.Server.ReplicaID()
	}, "no presence record of the agent naming replica A")
	if b.Server.Kontrol.Conn(a.machine.KiteID) != nil {
		t.Fatal("the agent is connected to B too: the test would prove nothing")
	}
	fb := &flowEnv{Env: b, t: t, dir: a.dir, tfDir: a.tfDir, alice: b.Dial("alice")}
	return &meshEnv{termEnv: a, b: &termEnv{flowEnv: fb, machine: a.machine}, bEnv: b}
}

// replicaKey is a replica key of a replica called id (signed with the shared keyring).
func (e *meshEnv) replicaKey(id string) kite.Auth {
	e.t.Helper()
	key, err := e.Server.Signer().ReplicaKey(id, time.Minute)
	if err != nil {
		e.t.Fatal(err)
	}
	return kite.Auth{Type: kitekey.KindReplicaKey, Key: key}
}

// TestReplicaMesh: a klient connected to replica A is reached through replica B: its sessions
// listed, a terminal opened via B relays bytes both ways (klient's attachment lands on A and
// is proxied to B), reattached with its replay; errors of the agent come back unchanged;
// kontrol.query on B sees the agent; only replica keys call replica.agentCall, and they call
// nothing else; a replica that stops beating is swept by the other.
func TestReplicaMesh(t *testing.T) {
	t.Parallel()
	e := newMeshEnv(t)
	ctx := t.Context()
	cookie := e.b.login("alice", "alice-password")

	// A terminal through B: B calls webterm.connect via A, klient dials the "balancer" (A) with
	// B's ticket, A proxies the WebSocket to B.
	term := e.b.mustOpen(cookie, "session=mesh&cols=100&rows=30")
	term.Type(t, "echo mesh-$((40+2))\r")
	term.WaitFor(t, "mesh-42")
	if n := term.Notices(); len(n) != 1 || n[0] != `{"session":"mesh","mode":"create","created":true}` {
		t.Fatalf("notices: %q", n)
	}
	if ss := e.b.sessions(cookie); len(ss) != 1 || ss[0].Session != "mesh" {
		t.Fatalf("sessions via B: %+v", ss)
	}
	term.WS.Close(websocket.StatusNormalClosure, "")
	testutil.Eventually(t, 20*time.Second, func() bool { s := e.b.sessions(cookie); return len(s) == 1 && len(s[0].Viewers) == 0 }, "viewer not detached")
	again := e.b.mustOpen(cookie, "session=mesh&cols=100&rows=30")
	again.WaitFor(t, "mesh-42") // the replay
	again.Type(t, "echo back-$((5*5))\r")
	again.WaitFor(t, "back-25")

	// An error the agent answers is the same through either replica: killing an unknown session
	// answers the same status and message via A (its connection) and via B (forwarded).
	kill := func(env *termEnv) (int, string) {
		req, _ := http.NewRequest("DELETE", env.URL+"/api/machines/"+env.machine.ID+"/sessions/no-such-session", nil)
		req.Header.Set("Cookie", kloud.SessionCookie+"="+cookie)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	sa, ba := kill(e.termEnv)
	sb, bb := kill(e.b)
	if sa != sb || ba != bb || sa == http.StatusOK {
		t.Errorf("kill of an unknown session: %d %s via A, %d %s via B", sa, ba, sb, bb)
	}
	// And on the wire: replica.agentCall answers klient's error object as klient did.
	info := kontrolQuery(t, e.b.Dial("alice"), e.machine.KiteID)
	if len(info) != 1 || info[0].Kite.ID != e.machine.KiteID {
		t.Fatalf("kontrol.query on B for A's agent: %+v", info)
	}
	tok, err := e.Server.Signer().Token("alice", e.machine.KiteID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(klientapi.SessionParams{Token: tok, Session: "no-such-session"})
	viaA := e.DialAuth(e.replicaKey("test-replica")).Call(ctx, api.MethodReplicaAgentCall,
		api.ReplicaAgentCallParams{KiteID: e.machine.KiteID, Method: klientapi.MethodWebtermKill, Params: raw}, nil)
	var fe *kite.Error
	if !errors.As(viaA, &fe) || fe.Type() == api.ErrTypeAgentAway || fe.Code == kite.CodeInternal || !strings.Contains(ba, strings.Trim(string(must(json.Marshal(fe.Message))), `"`)) {
		t.Errorf("klient's error through replica.agentCall: %#v; through A's HTTP: %s", viaA, ba)
	}
	var res api.ReplicaAgentCallResult
	if err := e.DialAuth(e.replicaKey("test-replica")).Call(ctx, api.MethodReplicaAgentCall,
		api.ReplicaAgentCallParams{KiteID: e.machine.KiteID, Method: klientapi.MethodInfo}, &res); err != nil || !strings.Contains(string(res.Result), `"version"`) {
		t.Errorf("klient.info through replica.agentCall: %s %v", res.Result, err)
	}
	// Not an agent of A's: agentAway (-32005), which B treats as the agent being away.
	err = e.DialAuth(e.replicaKey("test-replica")).Call(ctx, api.MethodReplicaAgentCall,
		api.ReplicaAgentCallParams{KiteID: "agent.nobody", Method: klientapi.MethodInfo}, nil)
	if !errors.As(err, &fe) || fe.Code != kite.CodeState || fe.Type() != api.ErrTypeAgentAway {
		t.Errorf("an agent A does not hold: %v", err)
	}
	// Methods a replica does not forward.
	err = e.DialAuth(e.replicaKey("test-replica")).Call(ctx, api.MethodReplicaAgentCall,
		api.ReplicaAgentCallParams{KiteID: e.machine.KiteID, Method: "kontrol.getToken"}, nil)
	if !errors.Is(err, kite.ErrInvalidParams) {
		t.Errorf("forwarding kontrol.getToken: %v, want -32602", err)
	}

	// Who may call replica.agentCall: replica keys only; and replica keys nothing else.
	agentKey, _, err := e.Server.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: "alice", MachineID: e.machine.ID, StackID: e.machine.StackID})
	if err != nil {
		t.Fatal(err)
	}
	pluginKey, _, err := e.Server.Kontrol.CreatePluginKey(kitekey.PluginKeySpec{Provider: "example"})
	if err != nil {
		t.Fatal(err)
	}
	adminKey, _, err := e.Server.Kontrol.CreateKey(kloud.Admin, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]kite.Auth{
		"admin":      {Type: kite.AuthKiteKey, Key: adminKey},
		"agent key":  {Type: kite.AuthKiteKey, Key: agentKey},
		"plugin key": {Type: kitekey.KindPluginKey, Key: pluginKey},
	} {
		err := e.DialAuth(a).Call(ctx, api.MethodReplicaAgentCall, api.ReplicaAgentCallParams{KiteID: e.machine.KiteID, Method: klientapi.MethodInfo}, nil)
		if !errors.Is(err, kite.ErrPermission) {
			t.Errorf("replica.agentCall with a %s: %v, want -32002", name, err)
		}
	}
	rc := e.DialAuth(e.replicaKey("test-replica"))
	for _, m := range []string{api.MethodStackList, api.MethodUserWhoami, kontrolapi.MethodQuery, kontrolapi.MethodGetToken, kontrolapi.MethodRegister, "kite.systemInfo"} {
		if err := rc.Call(ctx, m, map[string]any{}, nil); !errors.Is(err, kite.ErrPermission) {
			t.Errorf("%s with a replica key: %v, want -32002", m, err)
		}
	}

	// The figure (docs/deployment.md): the same agent call (GET sessions: webterm.list) through
	// the replica holding the agent's connection and through the other, interleaved.
	var here, there []time.Duration
	for range 100 {
		for _, env := range []*termEnv{e.termEnv, e.b} {
			start := time.Now()
			env.sessions(cookie)
			if env == e.b {
				there = append(there, time.Since(start))
			} else {
				here = append(here, time.Since(start))
			}
		}
	}
	t.Logf("webterm.list over HTTP, 100 calls each: same replica p50 %v p90 %v; other replica p50 %v p90 %v",
		quantile(here, 0.5), quantile(here, 0.9), quantile(there, 0.5), quantile(there, 0.9))

	// A replica that stops beating (killed: its records stay) is swept by the live one: its
	// presence records go, then its record.
	st := e.bEnv.Server.Store()
	if err := st.Replicas().Beat(ctx, store.ReplicaRecord{ID: "dead.replica", InternalURL: "http://127.0.0.1:1"}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := st.Kites().Upsert(ctx, store.KiteRecord{ID: "agent.ghost", Username: "alice", Name: "klient", Replica: "dead.replica"}); err != nil {
		t.Fatal(err)
	}
	// Two machines whose presence records name the dead replica: one last seen there, one whose
	// agent registered again with A before its presence record was rewritten (ci49's
	// TestBackupRestore: the sweep marked such an agent disconnected).
	if err := st.Kites().Upsert(ctx, store.KiteRecord{ID: "agent.returned", Username: "alice", Name: "klient", Replica: "dead.replica"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Machines().InsertMany(ctx, []model.Machine{
		{ID: "mesh-ghost", StackID: "mesh-none", Label: "ghost", KiteID: "agent.ghost", Agent: model.Agent{Status: model.AgentConnected, Replica: "dead.replica"}},
		{ID: "mesh-returned", StackID: "mesh-none", Label: "returned", KiteID: "agent.returned", Agent: model.Agent{Status: model.AgentConnected, Replica: e.Server.ReplicaID()}},
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, kerr := st.Kites().Get(ctx, "agent.ghost")
		_, rerr := st.Replicas().Get(ctx, "dead.replica")
		return errors.Is(kerr, store.ErrNotFound) && errors.Is(rerr, store.ErrNotFound)
	}, "the dead replica's records were not swept")
	t.Logf("dead replica swept %v after its record expired (heartbeat 500ms, expiry 3 heartbeats)", time.Since(start).Round(time.Millisecond))
	if r, err := st.Kites().Get(ctx, e.machine.KiteID); err != nil || r.Replica != e.Server.ReplicaID() {
		t.Errorf("the live agent's record after the sweep: %+v %v", r, err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		m, err := st.Machines().ByKite(ctx, "agent.ghost")
		return err == nil && m.Agent.Status == model.AgentDisconnected
	}, "the dead replica's agent is not marked disconnected")
	if m, err := st.Machines().ByKite(ctx, "agent.returned"); err != nil || m.Agent.Status != model.AgentConnected {
		t.Errorf("an agent that registered again with A, after the dead replica's sweep: %+v %v; want it connected", m.Agent, err)
	}

	// A stops: its agent's presence goes with it, and B no longer finds the agent.
	e.Stop()
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := st.Kites().Get(ctx, e.machine.KiteID)
		return errors.Is(err, store.ErrNotFound)
	}, "A's presence record outlived A")
	if info := kontrolQuery(t, e.b.Dial("alice"), e.machine.KiteID); len(info) != 0 {
		t.Errorf("kontrol.query on B after A stopped: %+v", info)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))].Round(10 * time.Microsecond)
}

func kontrolQuery(t *testing.T, c *kite.Conn, id string) []kontrolapi.KiteInfo {
	t.Helper()
	var res kontrolapi.QueryResult
	if err := c.Call(t.Context(), kontrolapi.MethodQuery, kontrolapi.QueryParams{Query: kite.Identity{ID: id}}, &res); err != nil {
		t.Fatalf("kontrol.query: %v", err)
	}
	return res.Kites
}
