package kloud_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/events"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/kontrol"
)

// startReplicas starts n kloud replicas sharing one database (--replicas) on a real `kloud store
// serve` (storetest.Serve: correct with several clients), one after another (the first creates
// the signing key and the admin; the others find them).
func startReplicas(t *testing.T, n int, tune ...func(*kloudtest.Options)) []*kloudtest.Env {
	t.Helper()
	url, db := storetest.Serve(t), "kloud"
	var out []*kloudtest.Env
	var key []byte
	for i := range n {
		dir := t.TempDir()
		if i > 0 { // replicas share the store's secret key
			if err := os.WriteFile(filepath.Join(dir, "secret.key"), key, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		o := kloudtest.Options{DataDir: dir, MongoURL: url, MongoDatabase: db, Replicas: true}
		for _, f := range tune {
			f(&o)
		}
		out = append(out, kloudtest.Start(t, o))
		if i == 0 {
			var err error
			if key, err = os.ReadFile(filepath.Join(dir, "secret.key")); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

// TestEventsAcrossReplicas: two replicas on one store. A machine's change written through
// replica A reaches alice's event.watch on replica B, and B's write reaches A's; a share made
// through A's API reaches bob on B (the audience travels with the event); each subscriber gets
// each change exactly once (after the writes, the next event is a marker published last); and
// the change→event latency across replicas is logged (docs/deployment.md has the figures).
func TestEventsAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := startReplicas(t, 2)
	a, b := rs[0], rs[1]
	ctx := t.Context()
	addUsers(t, a, false, "alice", "bob")
	watch := func(e *kloudtest.Env, user string) *api.EventWatch {
		t.Helper()
		w, err := api.NewClient(e.Dial(user)).EventWatch(ctx, api.EventWatchParams{Topics: []string{"machines"}})
		if err != nil {
			t.Fatalf("event.watch as %s: %v", user, err)
		}
		t.Cleanup(w.Close)
		return w
	}
	next := func(who string, w *api.EventWatch) api.Event {
		t.Helper()
		nctx, cancel := context.WithTimeout(ctx, time.Minute) // a missing event fails, not hangs
		defer cancel()
		ev, err := w.Next(nctx)
		if err != nil {
			t.Fatalf("%s's next event: %v", who, err)
		}
		return ev
	}
	expect := func(who string, w *api.EventWatch, id string, topic string) {
		t.Helper()
		if ev := next(who, w); ev.Kind != "machine" || ev.ID != id || ev.Op != "changed" || !slices.Contains(ev.Topics, topic) {
			t.Fatalf("%s got %+v, want machine %s changed in %s", who, ev, id, topic)
		}
	}
	aliceA, aliceB, bobB := watch(a, "alice"), watch(b, "alice"), watch(b, "bob")
	now := time.Now()
	if err := a.Server.Store().Machines().InsertMany(ctx, []model.Machine{
		{ID: "ma", StackID: "sa", Label: "a", Owner: "alice", Team: model.DefaultTeam, State: "Running", CreatedAt: now, UpdatedAt: now},
	}); err != nil {
		t.Fatal(err)
	}
	expect("alice on A", aliceA, "ma", "machines")
	expect("alice on B", aliceB, "ma", "machines") // created through A
	set := func(e *kloudtest.Env, state string) {
		t.Helper()
		if err := e.Server.Store().Machines().Set(ctx, "ma", store.MachineSet{State: &state}); err != nil {
			t.Fatal(err)
		}
	}

	// Writes through A, B, A: both of alice's streams get each once, whichever replica wrote.
	var lat []time.Duration
	for i, e := range []*kloudtest.Env{a, b, a} {
		start := time.Now()
		set(e, []string{"Stopped", "Running", "Stopped"}[i])
		other := aliceB
		if e == b {
			other = aliceA
		}
		expect("alice on the other replica", other, "ma", "machines")
		lat = append(lat, time.Since(start))
		if e == b {
			expect("alice on A", aliceB, "ma", "machines")
		} else {
			expect("alice on A", aliceA, "ma", "machines")
		}
	}
	// A share through A's API: bob, watching on B, is told (he may see it now).
	if _, err := api.NewClient(a.Dial("alice")).MachineShare(ctx, api.ShareParams{MachineID: "ma", Username: "bob", Grant: model.GrantTerminal}); err != nil {
		t.Fatalf("machine.share: %v", err)
	}
	expect("bob on B", bobB, "ma", "shares")
	expect("alice on B", aliceB, "ma", "shares")
	expect("alice on A", aliceA, "ma", "shares")

	// Nothing twice: the next event of every stream is the marker each replica publishes now
	// (a resync reaches every stream).
	for _, e := range rs {
		e.Server.Events().Publish(events.Event{Op: events.OpResync, Kind: "marker"})
	}
	for who, w := range map[string]*api.EventWatch{"alice on A": aliceA, "alice on B": aliceB, "bob on B": bobB} {
		if ev := next(who, w); ev.Op != "resync" {
			t.Errorf("%s got %+v after the writes, want nothing more before the marker", who, ev)
		}
	}

	// The latency, over more round trips: a write on one replica until the other's stream has it.
	for i := range 20 {
		e, w := a, aliceB
		if i%2 == 1 {
			e, w = b, aliceA
		}
		start := time.Now()
		set(e, []string{"Stopped", "Running"}[i%2])
		expect("alice", w, "ma", "machines")
		lat = append(lat, time.Since(start))
		// the writer's own stream has it too
		if e == a {
			expect("alice on A", aliceA, "ma", "machines")
		} else {
			expect("alice on B", aliceB, "ma", "machines")
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("change→event across replicas over %d writes: p50 %s, p90 %s, max %s", len(lat),
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*9/10].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
}

// TestKontrolWatchAcrossReplicas: a kontrol.watch on replica B sees an agent register on A and
// go away. The agent status of its machine is A's to write: when the agent is registered on B
// as well (it reconnected there before A noticed its old connection dead) and A then drops
// the old one, the machine stays connected, and B's watcher does not see a deregister.
func TestKontrolWatchAcrossReplicas(t *testing.T) {
	t.Parallel()
	rs := startReplicas(t, 2)
	a, b := rs[0], rs[1]
	ctx := t.Context()
	addUsers(t, a, false, "alice")
	now := time.Now()
	machines := a.Server.Store().Machines()
	if err := machines.InsertMany(ctx, []model.Machine{
		{ID: "ma", StackID: "sa", Label: "a", Owner: "alice", Team: model.DefaultTeam, State: "Running", CreatedAt: now, UpdatedAt: now},
		{ID: "mb", StackID: "sa", Label: "b", Owner: "alice", Team: model.DefaultTeam, State: "Running", CreatedAt: now, UpdatedAt: now},
	}); err != nil {
		t.Fatal(err)
	}
	agentKey := func(machine string) (string, string) {
		key, kid, err := a.Server.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: "alice", MachineID: machine, StackID: "sa"})
		if err != nil {
			t.Fatal(err)
		}
		if err := machines.Set(ctx, machine, store.MachineSet{KiteID: &kid}); err != nil {
			t.Fatal(err)
		}
		return key, kid
	}
	keyA, kidA := agentKey("ma")
	keyB, kidB := agentKey("mb")

	// alice watches every kite of hers on B.
	watcher := b.Dial("alice")
	var res kontrol.QueryResult
	if err := watcher.Call(ctx, "kontrol.query", kontrol.QueryParams{Query: kite.Identity{Username: "alice"}, Watch: true}, &res); err != nil {
		t.Fatal(err)
	}
	sub := watcher.Subscribe(res.Subscription)
	t.Cleanup(sub.Close)
	next := func() kontrol.Event {
		t.Helper()
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		ev, err := sub.Next(nctx)
		if err != nil {
			t.Fatalf("kontrol.watch on B: %v", err)
		}
		var out kontrol.Event
		if err := json.Unmarshal(ev.Data, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	agentStatus := func(id, want string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			m, err := machines.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if m.Agent.Status == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("machine %s: agent %q, want %q", id, m.Agent.Status, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// The agent registers on A: B's watcher sees it; it goes away: B's watcher sees that.
	onA := a.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: keyA})
	kloudtest.Call(t, onA, "kontrol.register", kontrol.RegisterParams{}, nil)
	if ev := next(); ev.Action != "register" || ev.Kite.Kite.ID != kidA {
		t.Fatalf("B's watcher got %+v, want %s registering", ev, kidA)
	}
	agentStatus("ma", model.AgentConnected)
	onA.Close(nil)
	if ev := next(); ev.Action != "deregister" || ev.Kite.Kite.ID != kidA {
		t.Fatalf("B's watcher got %+v, want %s going", ev, kidA)
	}
	agentStatus("ma", model.AgentDisconnected)

	// Registered on A, then again on B (its reconnect reached B first); then A drops the old
	// connection. B's watcher: register (A), register (B), and not the deregister from A.
	onA = a.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: keyA})
	kloudtest.Call(t, onA, "kontrol.register", kontrol.RegisterParams{}, nil)
	if ev := next(); ev.Action != "register" || ev.Kite.Kite.ID != kidA {
		t.Fatalf("B's watcher got %+v, want %s registering on A", ev, kidA)
	}
	onB := b.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: keyA})
	kloudtest.Call(t, onB, "kontrol.register", kontrol.RegisterParams{}, nil)
	if ev := next(); ev.Action != "register" || ev.Kite.Kite.ID != kidA {
		t.Fatalf("B's watcher got %+v, want %s registering on B", ev, kidA)
	}
	onA.Close(nil)
	// Another agent registering on A afterwards: A's agent tracking handles its kontrol's
	// events in order, so once mb shows connected, A has dealt with ma's old connection; and
	// B's watcher's next event is mb's.
	other := a.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: keyB})
	kloudtest.Call(t, other, "kontrol.register", kontrol.RegisterParams{}, nil)
	agentStatus("mb", model.AgentConnected)
	if ev := next(); ev.Action != "register" || ev.Kite.Kite.ID != kidB {
		t.Fatalf("B's watcher got %+v, want %s registering (and no deregister of %s, which is on B)", ev, kidB, kidA)
	}
	if m, err := machines.Get(ctx, "ma"); err != nil || m.Agent.Status != model.AgentConnected {
		t.Fatalf("machine ma: agent %+v (%v), want connected: it is on B, and A must not mark it gone", m.Agent, err)
	}
}
