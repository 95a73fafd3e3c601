package kloud_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/events"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kontrol"
	"github.com/kloud-dev/kloud/provider"
)

// TestEventWatch: event.watch through the real API. Alice and bob (members of one team) each
// own a machine; a change kloud writes to a machine reaches its owner and kloud admins, never
// the other member; sharing alice's machine with bob tells bob, and so does taking the share
// away; an agent registering is an "agents" event; a stack's filter keeps other stacks out;
// a provider appearing reaches everyone's providers stream; unknown topics are refused.
func TestEventWatch(t *testing.T) {
	t.Parallel()
	e := kloudtest.Start(t, kloudtest.Options{})
	ctx := t.Context()
	addUsers(t, e, false, "alice", "bob")
	machines := e.Server.Store().Machines()
	now := time.Now()
	for _, m := range []model.Machine{
		{ID: "ma", StackID: "sa", Label: "a", Owner: "alice", Team: model.DefaultTeam, State: "Running", CreatedAt: now, UpdatedAt: now},
		{ID: "mb", StackID: "sb", Label: "b", Owner: "bob", Team: model.DefaultTeam, State: "Running", CreatedAt: now, UpdatedAt: now},
	} {
		if err := machines.InsertMany(ctx, []model.Machine{m}); err != nil {
			t.Fatal(err)
		}
	}
	watch := func(user string, p api.EventWatchParams) *api.EventWatch {
		t.Helper()
		w, err := api.NewClient(e.Dial(user)).EventWatch(ctx, p)
		if err != nil {
			t.Fatalf("event.watch as %s: %v", user, err)
		}
		t.Cleanup(w.Close)
		return w
	}
	all := api.EventWatchParams{Topics: []string{"machines"}}
	alice, bob, admin := watch("alice", all), watch("bob", all), watch(kloud.Admin, all)
	aliceStack := watch("alice", api.EventWatchParams{Topics: []string{"machines", "stacks"}, StackID: "sb"}) // not hers: nothing
	aliceAgents := watch("alice", api.EventWatchParams{Topics: []string{"agents"}})
	next := func(who string, w *api.EventWatch) api.Event {
		t.Helper()
		// Not a latency check: a missing event fails the test instead of hanging it.
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		ev, err := w.Next(nctx)
		if err != nil {
			t.Fatalf("%s's next event: %v", who, err)
		}
		return ev
	}
	expect := func(who string, w *api.EventWatch, id, op string, topics ...string) {
		t.Helper()
		ev := next(who, w)
		if ev.Kind != "machine" || ev.ID != id || ev.Op != op || ev.At.IsZero() {
			t.Fatalf("%s got %+v, want machine %s %s", who, ev, id, op)
		}
		for _, tp := range topics {
			if !slices.Contains(ev.Topics, tp) {
				t.Fatalf("%s got %+v, want it in topic %s", who, ev, tp)
			}
		}
	}
	set := func(id, state string) {
		t.Helper()
		if err := machines.Set(ctx, id, store.MachineSet{State: &state}); err != nil {
			t.Fatal(err)
		}
	}

	// Bob's machine changes first, then alice's: alice's first event is her own (bob's would
	// have come first), bob's is his own; the admin sees both.
	set("mb", "Stopped")
	set("ma", "Stopped")
	expect("alice", alice, "ma", "changed", "machines")
	expect("bob", bob, "mb", "changed", "machines")
	seen := map[string]bool{}
	for len(seen) < 2 {
		seen[next("admin", admin).ID] = true
	}
	if !seen["ma"] || !seen["mb"] {
		t.Fatalf("admin saw %v, want both machines", seen)
	}

	// Sharing alice's machine with bob (the API) tells bob, in topic shares; so does the unshare.
	ac := api.NewClient(e.Dial("alice"))
	if _, err := ac.MachineShare(ctx, api.ShareParams{MachineID: "ma", Username: "bob", Grant: model.GrantTerminal}); err != nil {
		t.Fatalf("machine.share: %v", err)
	}
	expect("bob", bob, "ma", "changed", "shares")
	expect("alice", alice, "ma", "changed", "shares")
	if _, err := ac.MachineUnshare(ctx, api.ShareParams{MachineID: "ma", Username: "bob"}); err != nil {
		t.Fatalf("machine.unshare: %v", err)
	}
	expect("bob", bob, "ma", "changed", "shares") // he saw it before: he is told it went
	expect("alice", alice, "ma", "changed", "shares")
	// Now unshared, alice's machine changing again is not bob's business: his next is his own.
	set("ma", "Running")
	set("mb", "Running")
	expect("bob", bob, "mb", "changed")
	expect("alice", alice, "ma", "changed")

	// An agent of alice's machine registering: an "agents" event, from kontrol's presence.
	key, kid, err := e.Server.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: "alice", MachineID: "ma", StackID: "sa"})
	if err != nil {
		t.Fatal(err)
	}
	if err := machines.Set(ctx, "ma", store.MachineSet{KiteID: &kid}); err != nil {
		t.Fatal(err)
	}
	agent := e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: key})
	kloudtest.Call(t, agent, "kontrol.register", kontrol.RegisterParams{}, nil)
	expect("alice (agents)", aliceAgents, "ma", "changed", "agents")

	// The stack filter: alice watching bob's stack got none of the above; a change of her own
	// stack's machine does not reach that stream either. The first event it gets is a resync
	// we publish last (resyncs reach every stream).
	set("ma", "Stopped")
	e.Server.Events().Publish(events.Event{Op: events.OpResync})
	if ev := next("alice (stack sb)", aliceStack); ev.Op != "resync" {
		t.Fatalf("alice's stream of stack sb got %+v before the resync", ev)
	}

	// A provider coming (a builtin registered late, as a plugin connecting): everyone's
	// Providers page is told, from kloud's own look at the providers' status.
	bobProviders := watch("bob", api.EventWatchParams{Topics: []string{"providers"}})
	e.Server.Providers().Register(&provider.Provider{Name: "late", ResourceType: "late_machine"})
	if ev := next("bob (providers)", bobProviders); ev.Kind != "provider" || !slices.Contains(ev.Topics, "providers") {
		t.Fatalf("bob's providers stream got %+v", ev)
	}

	// Params are checked.
	for _, p := range []api.EventWatchParams{{}, {Topics: []string{"nope"}}} {
		if _, err := api.NewClient(e.Dial("alice")).EventWatch(ctx, p); !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("event.watch %+v: %v, want invalid params", p, err)
		}
	}

	// A connection holds at most MaxEventStreams: a page (or a script) cannot make kloud keep
	// subscribers without end.
	hog := api.NewClient(e.Dial("alice"))
	for i := range kloud.MaxEventStreams {
		if _, err := hog.EventWatch(ctx, api.EventWatchParams{Topics: []string{"machines"}}); err != nil {
			t.Fatalf("stream %d of %d: %v", i+1, kloud.MaxEventStreams, err)
		}
	}
	if _, err := hog.EventWatch(ctx, api.EventWatchParams{Topics: []string{"machines"}}); !errors.Is(err, kite.ErrRateLimited) {
		t.Errorf("stream %d on one connection: %v, want refused", kloud.MaxEventStreams+1, err)
	}
}
