// Package events is kloud's in-process event hub: what changed (a machine's state, its agent's
// status, its shares, a stack, a job's progress, a snapshot, a bucket claim), named by kind and
// id with who may see it, fanned out to subscribers (events.watch streams to the web pages).
//
// Start reading at [Hub] (the interface kloud uses) and [New] (the one implementation, a
// process-local fan-out). [Local.Publish] never blocks: each subscriber has a bounded queue, and
// one that falls behind loses what is queued and gets a single [OpResync] event instead, after
// which it must read again what it shows. Filtering by who may see an event is the subscriber's
// filter (kloud's events.watch applies the same rules as the list and get methods to
// [Event.Audience]).
//
// Several kloud replicas (issue 24, kloud/eventlog.go) also publish what the others wrote,
// read from the store's change log; the hub does not care who publishes.
package events

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Topic is a family of events a subscriber asks for.
type Topic string

// Topics.
const (
	TopicMachines  Topic = "machines"  // any change of a machine (state, agent, shares, ports, idle settings…)
	TopicAgents    Topic = "agents"    // a machine's agent connected or disconnected
	TopicShares    Topic = "shares"    // a machine's shares changed
	TopicStacks    Topic = "stacks"    // a stack was created, changed or deleted
	TopicJobs      Topic = "jobs"      // a job was created or made progress
	TopicSnapshots Topic = "snapshots" // a snapshot record changed
	TopicBuckets   Topic = "buckets"   // a bucket claim changed
	TopicProviders Topic = "providers" // a provider connected, disconnected or failed (provider.list changed)
)

// Topics lists every topic.
func Topics() []Topic {
	return []Topic{TopicMachines, TopicAgents, TopicShares, TopicStacks, TopicJobs, TopicSnapshots, TopicBuckets, TopicProviders}
}

// Ops of an event.
const (
	OpChanged = "changed" // created or changed: read it again
	OpDeleted = "deleted" // gone
	OpResync  = "resync"  // events were lost (the subscriber fell behind): read everything again
)

// Audience says who may see an event: its owner, the admins of its team (kloud admins count as
// admins of every team), and Users (a machine's shares). An event with no Team goes to kloud
// admins besides its owner and Users (a job).
type Audience struct {
	Everyone bool // every user (a provider's status: provider.list is everyone's)
	Owner    string
	Team     string   // its team's admins see it ("": none)
	Users    []string // others who see it (a machine's shared users, before and after a change)
}

// Event is one change. Topics lists every topic it belongs to (a machine's agent change is in
// machines and agents).
type Event struct {
	Topics   []Topic
	Kind     string // "machine", "stack", "job", "snapshot", "bucket" ("" for a resync)
	ID       string
	Op       string // OpChanged, OpDeleted, OpResync
	StackID  string // the stack a machine, job or bucket claim belongs to ("" if none)
	Data     any    // what the event carries besides its name (a job's progress), or nil
	At       time.Time
	Audience Audience
}

// In reports whether e belongs to topic t (a resync belongs to every topic).
func (e Event) In(t Topic) bool { return e.Op == OpResync || slices.Contains(e.Topics, t) }

// Hub fans events out to subscribers. kloud has one per process ([New]).
type Hub interface {
	// Publish hands e to every subscriber whose filter takes it. It never blocks.
	Publish(e Event)
	// Subscribe returns a subscription to the events filter takes (nil: all), until ctx ends
	// or Close is called.
	Subscribe(ctx context.Context, filter func(Event) bool) *Subscription
}

// Options configure [New]. Zero fields take the documented defaults.
type Options struct {
	// Buffer is how many events a subscriber may have queued before it is resynced: its queue
	// is dropped for one OpResync event. Default 256.
	Buffer int
	// Now stamps events published without At. Default time.Now.
	Now func() time.Time
}

// Local is the process-local [Hub].
type Local struct {
	buffer int
	now    func() time.Time
	mu     sync.RWMutex
	subs   map[*Subscription]struct{}
}

// New returns an empty hub.
func New(opts Options) *Local {
	if opts.Buffer <= 0 {
		opts.Buffer = 256
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Local{buffer: opts.Buffer, now: opts.Now, subs: map[*Subscription]struct{}{}}
}

// Publish implements [Hub].
func (h *Local) Publish(e Event) {
	if e.At.IsZero() {
		e.At = h.now()
	}
	if e.Op == "" {
		e.Op = OpChanged
	}
	h.mu.RLock()
	subs := make([]*Subscription, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.mu.RUnlock()
	for _, s := range subs {
		if s.filter == nil || e.Op == OpResync || s.filter(e) {
			s.push(e)
		}
	}
}

// Subscribe implements [Hub].
func (h *Local) Subscribe(ctx context.Context, filter func(Event) bool) *Subscription {
	s := &Subscription{hub: h, filter: filter, max: h.buffer, wake: make(chan struct{}, 1), done: make(chan struct{})}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	return s
}

// Subscribers returns how many subscriptions are open (tests, metrics).
func (h *Local) Subscribers() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.subs)
}

// Subscription is one subscriber's queue.
type Subscription struct {
	hub    *Local
	filter func(Event) bool
	max    int
	wake   chan struct{} // cap 1: something was queued
	done   chan struct{}
	once   sync.Once

	mu      sync.Mutex
	queue   []Event
	dropped int // events lost to resyncs, in all
}

func (s *Subscription) push(e Event) {
	s.mu.Lock()
	if len(s.queue) >= s.max {
		// Fallen behind: what is queued is worth less than a re-read. One resync replaces it.
		s.dropped += len(s.queue) + 1
		s.queue = append(s.queue[:0], Event{Op: OpResync, At: e.At})
	} else {
		s.queue = append(s.queue, e)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Next returns the next event, waiting for one until ctx ends or the subscription is closed
// (then it returns ctx's error or context.Canceled).
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			e := s.queue[0]
			s.queue[0] = Event{}
			s.queue = s.queue[1:]
			s.mu.Unlock()
			return e, nil
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-s.done:
			return Event{}, context.Canceled
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Dropped returns how many events this subscriber lost to resyncs.
func (s *Subscription) Dropped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Done is closed when the subscription is closed.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Close ends the subscription; queued events are dropped.
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.hub.mu.Lock()
		delete(s.hub.subs, s)
		s.hub.mu.Unlock()
		close(s.done)
	})
}
