package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/events"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kontrol"
)

// Events across replicas (ARCHITECTURE §9, issue 24; docs/deployment.md "Events across
// replicas"). With Options.Replicas, every event this replica publishes to its hub (eventfeed.go:
// what its store writes changed; the providers' status) and every registration and
// deregistration of a kite connected to it (kontrol Options.OnEvent) is also appended to the
// store's change log (store.ChangeLog: a gap-free sequence, an entry per event, carrying what
// the hub needs and the replica that wrote it). Every replica tails the log and publishes the
// other replicas' entries: events to its hub (so event.watch on any replica shows any replica's
// writes) and kite events to its kontrol.watch streams (kontrol.PublishRemote).
//
// Nothing is delivered twice: a replica skips its own entries (it published them when it wrote
// them) and reads each seq once, in order. Nothing is lost silently: a replica that finds the
// seq it waits for pruned while later ones exist (it fell behind the pruned log, or lost the
// store for longer than Keep), or that could not append its own events, publishes a resync
// (to its hub, and through the log to the others), after which pages read everything again.
//
// Cost (docs/deployment.md has the figures): an idle poll is one read by _id, the entry the
// tailer waits for (the one kind of filter the embedded FerretDB serves without a scan); an
// append is one insert per event, batched per wake-up. The log holds only Keep of entries.
// Without Options.Replicas (one kloud, embedded store or not) none of this runs.

// EventLogOptions tune the change log of several replicas (Options.EventLog). Zero fields take
// the defaults.
type EventLogOptions struct {
	// Poll is how often a replica looks for entries when the last look found none. Default
	// 200ms: the bound on the change→event latency across replicas, plus the store's round
	// trips.
	Poll time.Duration
	// Keep is how long entries stay in the log; a replica further behind (or without the store
	// for longer) resyncs. Default 2m.
	Keep time.Duration
	// PruneEvery is how often each replica prunes entries older than Keep. Default 15s.
	PruneEvery time.Duration
	// MaxPending bounds the events waiting to be appended; past it they are dropped for one
	// resync. Default 10000.
	MaxPending int
}

func (o *EventLogOptions) defaults() {
	if o.Poll <= 0 {
		o.Poll = 200 * time.Millisecond
	}
	if o.Keep <= 0 {
		o.Keep = 2 * time.Minute
	}
	if o.PruneEvery <= 0 {
		o.PruneEvery = 15 * time.Second
	}
	if o.MaxPending <= 0 {
		o.MaxPending = 10000
	}
}

// logBody is one change log entry's body (JSON): an event or a kite event.
type logBody struct {
	Event *logEvent      `json:"event,omitempty"`
	Kite  *kontrol.Event `json:"kite,omitempty"`
}

// logEvent is an events.Event as the log carries it.
type logEvent struct {
	Topics   []events.Topic `json:"topics,omitempty"`
	Kind     string         `json:"kind,omitempty"`
	ID       string         `json:"id,omitempty"`
	Op       string         `json:"op"`
	StackID  string         `json:"stackId,omitempty"`
	Job      *api.JobEvent  `json:"job,omitempty"`
	At       time.Time      `json:"at"`
	Everyone bool           `json:"everyone,omitempty"`
	Owner    string         `json:"owner,omitempty"`
	Team     string         `json:"team,omitempty"`
	Users    []string       `json:"users,omitempty"`
}

func toLogEvent(e events.Event) *logEvent {
	l := &logEvent{Topics: e.Topics, Kind: e.Kind, ID: e.ID, Op: e.Op, StackID: e.StackID, At: e.At,
		Everyone: e.Audience.Everyone, Owner: e.Audience.Owner, Team: e.Audience.Team, Users: e.Audience.Users}
	if j, ok := e.Data.(api.JobEvent); ok {
		l.Job = &j
	}
	return l
}

func (l *logEvent) event() events.Event {
	e := events.Event{Topics: l.Topics, Kind: l.Kind, ID: l.ID, Op: l.Op, StackID: l.StackID, At: l.At,
		Audience: events.Audience{Everyone: l.Everyone, Owner: l.Owner, Team: l.Team, Users: l.Users}}
	if l.Job != nil {
		e.Data = *l.Job
	}
	return e
}

// eventLog appends this replica's events to the change log and publishes the others'.
type eventLog struct {
	st      *store.Store
	hub     events.Hub // this process's hub (subscribers)
	kontrol *kontrol.Kontrol
	replica string
	opts    EventLogOptions
	log     *slog.Logger

	mu       sync.Mutex
	pending  []string // bodies to append, in order
	lost     bool     // events were dropped or could not be appended: a resync goes first
	wake     chan struct{}
	next     int64 // the seq the tailer waits for (0: not started)
	appended int64 // the last seq this replica appended
	ready    chan struct{}
	stats    eventLogStats
}

// eventLogStats count what the log did (tests, docs/deployment.md).
type eventLogStats struct {
	Appended, Delivered, Polls, Resyncs int64
}

func newEventLog(st *store.Store, hub events.Hub, k *kontrol.Kontrol, opts EventLogOptions, log *slog.Logger) *eventLog {
	opts.defaults()
	return &eventLog{st: st, hub: hub, kontrol: k, replica: st.InstanceID(), opts: opts, log: log.With("component", "eventlog"),
		wake: make(chan struct{}, 1), ready: make(chan struct{})}
}

// sharedHub is the hub this replica publishes to: its own, and the change log for the others.
type sharedHub struct {
	events.Hub
	l *eventLog
}

// Publish implements events.Hub.
func (h sharedHub) Publish(e events.Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if e.Op == "" {
		e.Op = events.OpChanged
	}
	h.Hub.Publish(e)
	h.l.queue(logBody{Event: toLogEvent(e)})
}

// queueKite is kontrol's OnEvent: a kite of this replica registered or went away.
func (l *eventLog) queueKite(ev kontrol.Event) { l.queue(logBody{Kite: &ev}) }

func (l *eventLog) queue(b logBody) {
	data, err := json.Marshal(b)
	if err != nil {
		l.log.Error("encode change log entry", "err", err)
		return
	}
	l.mu.Lock()
	if len(l.pending) >= l.opts.MaxPending {
		l.pending, l.lost = l.pending[:0], true
	}
	l.pending = append(l.pending, string(data))
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

var resyncBody = func() string {
	b, _ := json.Marshal(logBody{Event: &logEvent{Op: events.OpResync}})
	return string(b)
}()

// run appends and tails until ctx ends (a background task: runEvents).
func (l *eventLog) run(ctx context.Context) {
	if !l.start(ctx) {
		return
	}
	close(l.ready)
	go l.appendLoop(ctx)
	l.tail(ctx)
}

// start finds the head of the log: this replica publishes what is written after it.
func (l *eventLog) start(ctx context.Context) bool {
	for {
		head, err := l.st.ChangeLog().Head(ctx)
		if err == nil {
			l.mu.Lock()
			l.next = head + 1
			l.mu.Unlock()
			return true
		}
		l.log.WarnContext(ctx, "change log: find its head", "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second):
		}
	}
}

// appendLoop writes queued bodies in batches.
func (l *eventLog) appendLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		}
		l.mu.Lock()
		batch, lost := l.pending, l.lost
		l.pending, l.lost = nil, false
		guess := max(l.appended+1, l.next)
		l.mu.Unlock()
		if lost {
			batch = append([]string{resyncBody}, batch...)
		}
		if len(batch) == 0 {
			continue
		}
		seq, err := l.st.ChangeLog().Append(ctx, guess, l.replica, batch...)
		l.mu.Lock()
		if err != nil {
			// The store is away: the other replicas miss these events. They resync once it
			// is back (the next append starts with a resync).
			l.lost = true
			if ctx.Err() == nil {
				l.log.WarnContext(ctx, "change log: append", "events", len(batch), "err", err)
			}
		} else {
			l.appended = seq
			l.stats.Appended += int64(len(batch))
		}
		l.mu.Unlock()
		if err != nil {
			select { // retry after a pause, not in a loop
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			select {
			case l.wake <- struct{}{}:
			default:
			}
		}
	}
}

// tailBatch is how many entries one read past the first takes.
const tailBatch = 256

// tail publishes the other replicas' entries in seq order until ctx ends.
func (l *eventLog) tail(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	lastPrune := time.Now()
	lastOK := time.Now()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := l.poll(ctx, failing || time.Since(lastOK) > l.opts.Keep/2)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				l.log.WarnContext(ctx, "change log: read", "err", err)
			}
			failing = true
			t.Reset(max(l.opts.Poll, time.Second))
			continue
		}
		failing, lastOK = false, time.Now()
		if time.Since(lastPrune) >= l.opts.PruneEvery {
			lastPrune = time.Now()
			l.prune(ctx)
		}
		if n > 0 {
			t.Reset(0) // there may be more
		} else {
			t.Reset(l.opts.Poll)
		}
	}
}

// poll reads what follows the last seq read and publishes it; checkGap also looks whether the
// seq waited for was pruned (after a store outage or a stall). It returns how many entries it
// read.
func (l *eventLog) poll(ctx context.Context, checkGap bool) (int, error) {
	l.mu.Lock()
	next := l.next
	l.stats.Polls++
	l.mu.Unlock()
	first, err := l.st.ChangeLog().Get(ctx, next)
	if errors.Is(err, store.ErrNotFound) {
		if !checkGap {
			return 0, nil
		}
		later, err := l.st.ChangeLog().From(ctx, next, 1)
		if err != nil || len(later) == 0 || later[0].Seq == next {
			return 0, err // nothing yet; or next was written meanwhile: read it next time
		}
		l.gap(ctx, next, later[0].Seq)
		return 1, nil
	}
	if err != nil {
		return 0, err
	}
	entries := []store.ChangeLogEntry{first}
	more, err := l.st.ChangeLog().From(ctx, next+1, tailBatch)
	if err != nil {
		return 0, err
	}
	entries = append(entries, more...)
	for i, e := range entries {
		if want := next + int64(i); e.Seq != want {
			// A hole only pruning makes: the entries from want on were pruned meanwhile.
			l.gap(ctx, want, e.Seq)
			return i + 1, nil
		}
		l.deliver(ctx, e)
		l.mu.Lock()
		l.next = e.Seq + 1
		l.mu.Unlock()
	}
	return len(entries), nil
}

// gap: the entries from want to got-1 were pruned before this replica read them. Its pages
// read everything again, and it goes on from got.
func (l *eventLog) gap(ctx context.Context, want, got int64) {
	l.log.WarnContext(ctx, "change log: fell behind the pruned log; pages resync", "want", want, "got", got)
	l.hub.Publish(events.Event{Op: events.OpResync})
	l.mu.Lock()
	l.next = got
	l.stats.Resyncs++
	l.mu.Unlock()
}

// deliver publishes another replica's entry here.
func (l *eventLog) deliver(ctx context.Context, e store.ChangeLogEntry) {
	if e.Replica == l.replica {
		return // published here when it was written
	}
	var b logBody
	if err := json.Unmarshal([]byte(e.Body), &b); err != nil {
		l.log.WarnContext(ctx, "change log: undecodable entry; pages resync", "seq", e.Seq, "err", err)
		l.hub.Publish(events.Event{Op: events.OpResync})
		return
	}
	l.mu.Lock()
	l.stats.Delivered++
	if b.Event != nil && b.Event.Op == events.OpResync {
		l.stats.Resyncs++
	}
	l.mu.Unlock()
	switch {
	case b.Event != nil:
		l.hub.Publish(b.Event.event())
	case b.Kite != nil && l.kontrol != nil:
		if b.Kite.Action == "deregister" && l.movedOn(ctx, b.Kite.Kite.Kite.ID, e.Replica) {
			return
		}
		l.kontrol.PublishRemote(*b.Kite)
	}
}

// movedOn reports whether an agent's presence record names a replica other than from, which
// says it went away from there: the kite reconnected elsewhere before from noticed.
func (l *eventLog) movedOn(ctx context.Context, kiteID, from string) bool {
	if !strings.HasPrefix(kiteID, AgentKitePrefix) {
		return false
	}
	r, err := l.st.Kites().Get(ctx, kiteID)
	return err == nil && r.Replica != from
}

// prune deletes entries older than Keep, never the newest this replica read.
func (l *eventLog) prune(ctx context.Context) {
	l.mu.Lock()
	head := l.next - 1
	l.mu.Unlock()
	if head < 1 {
		return
	}
	if _, err := l.st.ChangeLog().Prune(ctx, l.st.Now().Add(-l.opts.Keep), head); err != nil && ctx.Err() == nil {
		l.log.WarnContext(ctx, "change log: prune", "err", err)
	}
}

// Stats returns what the log did so far.
func (l *eventLog) Stats() eventLogStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// kiteEvent is kontrol's OnEvent: with several replicas, a kite of this one registered or went
// away (the change log takes it to the others' kontrol.watch streams).
func (s *Server) kiteEvent(ev kontrol.Event) {
	if s.elog != nil {
		s.elog.queueKite(ev)
	}
}
