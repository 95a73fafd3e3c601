package kloud

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/events"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

func machineBody(t *testing.T, id string) string {
	t.Helper()
	b, err := json.Marshal(logBody{Event: toLogEvent(events.Event{Topics: []events.Topic{events.TopicMachines}, Kind: "machine", ID: id, Op: events.OpChanged,
		At: time.Now(), Audience: events.Audience{Owner: "alice"}})})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEventLogTail: a replica's tailer, on a real store, publishes the other replicas' entries in
// order, once, and skips its own; when the entries it waits for were pruned (it fell behind), it
// publishes one resync and goes on from the oldest entry left, which it then publishes.
func TestEventLogTail(t *testing.T) {
	ctx := t.Context()
	st := storetest.New(t)
	hub := events.New(events.Options{})
	sub := hub.Subscribe(ctx, nil)
	l := newEventLog(st, hub, nil, EventLogOptions{}, testutil.Logger(t))
	if !l.start(ctx) || l.next != 1 {
		t.Fatalf("start: next %d, want 1 on an empty log", l.next)
	}
	log := st.ChangeLog()
	appendAs := func(replica string, ids ...string) {
		t.Helper()
		var bodies []string
		for _, id := range ids {
			bodies = append(bodies, machineBody(t, id))
		}
		if _, err := log.Append(ctx, 1, replica, bodies...); err != nil { // guess 1: the probe finds the head
			t.Fatal(err)
		}
	}
	poll := func(checkGap bool) {
		t.Helper()
		if _, err := l.poll(ctx, checkGap); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(want ...string) {
		t.Helper()
		hub.Publish(events.Event{Kind: "marker"})
		for _, w := range append(want, "marker") {
			nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			e, err := sub.Next(nctx)
			cancel()
			if err != nil {
				t.Fatalf("want %s: %v", w, err)
			}
			got := e.ID
			if e.Op == events.OpResync {
				got = "resync"
			} else if e.Kind == "marker" {
				got = "marker"
			}
			if got != w {
				t.Fatalf("got %s (%+v), want %s", got, e, w)
			}
		}
	}

	appendAs("other", "m1", "m2", "m3")
	poll(false)
	expect("m1", "m2", "m3")
	poll(false)
	expect() // read once

	appendAs(l.replica, "m4") // its own: published when it wrote it
	appendAs("other", "m5")
	poll(false)
	expect("m5")

	appendAs("other", "m6", "m7", "m8")
	head, err := log.Head(ctx)
	if err != nil || head != 8 {
		t.Fatalf("head %d (%v), want 8", head, err)
	}
	if n, err := log.Prune(ctx, time.Now().Add(time.Hour), head); err != nil || n != 7 {
		t.Fatalf("pruned %d (%v), want 7 (all but the newest)", n, err)
	}
	poll(false) // a cheap poll does not look past the entry it waits for
	expect()
	poll(true) // the gap check does
	expect("resync")
	poll(false)
	expect("m8")
	if s := l.Stats(); s.Resyncs != 1 || s.Delivered != 5 {
		t.Errorf("stats %+v, want 1 resync, 5 delivered", s)
	}
}

// TestEventLogAppend: racing writers with stale guesses leave a log without holes or doubles;
// a writer whose queue overflowed appends a resync before what it kept.
func TestEventLogAppend(t *testing.T) {
	ctx := t.Context()
	st := storetest.New(t)
	log := st.ChangeLog()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				if _, err := log.Append(ctx, 1, "r", machineBody(t, "x")); err != nil {
					t.Errorf("writer %d, append %d: %v", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	all, err := log.From(ctx, 1, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 100 {
		t.Fatalf("%d entries, want 100", len(all))
	}
	for i, e := range all {
		if e.Seq != int64(i+1) {
			t.Fatalf("entry %d has seq %d: a hole or a double", i, e.Seq)
		}
	}

	hub := events.New(events.Options{})
	l := newEventLog(st, hub, nil, EventLogOptions{MaxPending: 2}, testutil.Logger(t))
	if !l.start(ctx) {
		t.Fatal("start")
	}
	for _, id := range []string{"a", "b", "c"} { // a and b are dropped for a resync
		l.queue(logBody{Event: toLogEvent(events.Event{Kind: "machine", ID: id, Op: events.OpChanged})})
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.appendLoop(actx) }()
	deadline := time.Now().Add(time.Minute)
	for {
		if h, err := log.Head(ctx); err == nil && h >= 102 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the queued events were not appended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	got, err := log.From(ctx, 101, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, e := range got {
		var b logBody
		if err := json.Unmarshal([]byte(e.Body), &b); err != nil || b.Event == nil {
			t.Fatalf("entry %d: %q (%v)", e.Seq, e.Body, err)
		}
		ops = append(ops, b.Event.Op+":"+b.Event.ID)
	}
	if len(ops) != 2 || ops[0] != "resync:" || ops[1] != "changed:c" {
		t.Fatalf("appended %v, want a resync and then c", ops)
	}
}
