package kloud

import (
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/events"
	"github.com/kloud-dev/kloud/kloud/store"
)

// TestEventFeedJobs: a job's writes become events only when its progress changed (a heartbeat
// or a log line alone is none), each with the job's progress, its stack, and its owner as the
// audience; a finished job's next run starts afresh.
func TestEventFeedJobs(t *testing.T) {
	hub := events.New(events.Options{})
	f := newEventFeed(hub, testutil.Logger(t))
	sub := hub.Subscribe(t.Context(), nil)
	write := func(j store.Job) {
		f.publish(t.Context(), store.Change{Coll: store.CollJobs, ID: j.ID, Job: &j})
	}
	j := store.Job{ID: "j1", Target: "stack/s1", Owner: "alice", Status: store.JobRunning, Percent: 10, Stage: "Building"}
	write(j)
	write(j) // a heartbeat
	j.LogSeq = 3
	write(j) // a log line
	j.Percent = 40
	write(j)
	j.Status, j.Percent = store.JobSucceeded, 100
	write(j)
	var got []events.Event
	for range 3 {
		e, err := sub.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	for i, want := range []int{10, 40, 100} {
		e := got[i]
		je := wireEvent(e).Job
		if je == nil || je.Percentage != want || e.Kind != "job" || e.ID != "j1" || e.StackID != "s1" || e.Audience.Owner != "alice" {
			t.Errorf("event %d: %+v (job %+v), want job j1 of stack s1 at %d%% for alice", i, e, je, want)
		}
	}
	// Nothing else was published: the next is what we publish now.
	hub.Publish(events.Event{Kind: "marker"})
	if e, _ := sub.Next(t.Context()); e.Kind != "marker" {
		t.Fatalf("after the job's three events: %+v, want nothing else", e)
	}
	if len(f.shown) != 0 {
		t.Errorf("the finished job is still remembered: %v", f.shown)
	}
}

// TestEventTopicsAgree: the topics event.watch accepts (api) are the hub's.
func TestEventTopicsAgree(t *testing.T) {
	var hub []string
	for _, tp := range events.Topics() {
		hub = append(hub, string(tp))
	}
	if !slices.Equal(hub, api.EventTopics()) {
		t.Fatalf("hub topics %v, api topics %v", hub, api.EventTopics())
	}
}
