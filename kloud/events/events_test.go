package events_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kloud-dev/kloud/kloud/events"
)

func next(t *testing.T, s *events.Subscription) events.Event {
	t.Helper()
	e, err := s.Next(t.Context())
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	return e
}

// TestDeliversInOrderToEverySubscriber: two subscribers each get every event, in order.
func TestDeliversInOrderToEverySubscriber(t *testing.T) {
	h := events.New(events.Options{})
	a := h.Subscribe(t.Context(), nil)
	b := h.Subscribe(t.Context(), nil)
	for i := range 10 {
		h.Publish(events.Event{Kind: "machine", ID: fmt.Sprint(i), Topics: []events.Topic{events.TopicMachines}})
	}
	for _, s := range []*events.Subscription{a, b} {
		for i := range 10 {
			if e := next(t, s); e.ID != fmt.Sprint(i) || e.Op != events.OpChanged || e.At.IsZero() {
				t.Fatalf("event %d: %+v", i, e)
			}
		}
	}
}

// TestSlowSubscriberIsResynced: a subscriber that does not read loses its queue for one resync
// event; the publisher never blocks (it publishes far more than the buffer with nobody
// reading), and a subscriber that keeps up loses nothing.
func TestSlowSubscriberIsResynced(t *testing.T) {
	h := events.New(events.Options{Buffer: 8})
	slow := h.Subscribe(t.Context(), nil)
	fast := h.Subscribe(t.Context(), nil)
	for i := range 1000 {
		h.Publish(events.Event{Kind: "job", ID: fmt.Sprint(i)})
		if e := next(t, fast); e.ID != fmt.Sprint(i) || e.Op != events.OpChanged {
			t.Fatalf("fast subscriber: event %d is %+v", i, e)
		}
	}
	e := next(t, slow)
	if e.Op != events.OpResync {
		t.Fatalf("slow subscriber's first event: %+v, want a resync", e)
	}
	if d := slow.Dropped(); d < 990 {
		t.Fatalf("slow subscriber dropped %d, want nearly all of 1000", d)
	}
	// After the resync it gets what comes next.
	h.Publish(events.Event{Kind: "job", ID: "after"})
	for {
		e := next(t, slow)
		if e.ID == "after" {
			break
		}
		if e.Op != events.OpChanged {
			t.Fatalf("after the resync: %+v", e)
		}
	}
}

// TestFilter: a subscriber gets only what its filter takes, and every resync.
func TestFilter(t *testing.T) {
	h := events.New(events.Options{})
	mine := h.Subscribe(t.Context(), func(e events.Event) bool { return e.Audience.Owner == "alice" })
	h.Publish(events.Event{Kind: "machine", ID: "bob's", Audience: events.Audience{Owner: "bob"}})
	h.Publish(events.Event{Kind: "machine", ID: "alice's", Audience: events.Audience{Owner: "alice"}})
	h.Publish(events.Event{Op: events.OpResync})
	if e := next(t, mine); e.ID != "alice's" {
		t.Fatalf("first event: %+v, want alice's machine", e)
	}
	if e := next(t, mine); e.Op != events.OpResync {
		t.Fatalf("second event: %+v, want the resync", e)
	}
}

// TestCloseAndContext: a closed subscription, or one whose context ended, leaves the hub and
// its Next returns.
func TestCloseAndContext(t *testing.T) {
	h := events.New(events.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	a := h.Subscribe(ctx, nil)
	b := h.Subscribe(t.Context(), nil)
	if n := h.Subscribers(); n != 2 {
		t.Fatalf("%d subscribers, want 2", n)
	}
	cancel()
	<-a.Done()
	b.Close()
	if _, err := b.Next(t.Context()); err == nil {
		t.Fatal("Next on a closed subscription returned no error")
	}
	if n := h.Subscribers(); n != 0 {
		t.Fatalf("%d subscribers after close, want 0", n)
	}
	h.Publish(events.Event{Kind: "machine", ID: "x"}) // nobody: no panic, no block
}
