package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/events"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Events (issue 22 §4): every write the store makes to a machine, stack, job, snapshot or
// bucket claim (store.Options.OnChange) is queued here, then read again and published to the
// hub (kloud/events) with who may see it; event.watch streams what a caller may see to their
// page. Hooking the store, not the handlers, means every writer is covered (the build flow,
// the reconciler, kontrol's presence, snapshots, buckets) and one yet to be written too.
// Agent status comes through the same path: trackAgents (agents.go) writes it from kontrol's
// presence subscription.

// eventFeed turns store changes into hub events. onChange is the store's hook: it only queues
// (coalescing repeated changes of one document), so a write never waits for a reader; run
// reads the documents again and publishes.
type eventFeed struct {
	hub events.Hub
	log *slog.Logger
	st  *store.Store // set once the store is open (New)

	mu      sync.Mutex
	pending map[string]store.Change // by document key, coalesced
	order   []string
	wake    chan struct{}
	shown   map[string]api.JobEvent // the last progress published of each running job
}

func newEventFeed(hub events.Hub, log *slog.Logger) *eventFeed {
	return &eventFeed{hub: hub, log: log, pending: map[string]store.Change{}, wake: make(chan struct{}, 1), shown: map[string]api.JobEvent{}}
}

// changeKey names the documents of a change, so that later changes of them replace it.
func changeKey(c store.Change) string {
	return fmt.Sprintf("%s|%s|%s|%s|%t", c.Coll, c.ID, c.KiteID, c.StackID, c.Deleted)
}

// onChange is store.Options.OnChange: it queues c and returns at once.
func (f *eventFeed) onChange(c store.Change) {
	k := changeKey(c)
	f.mu.Lock()
	if old, ok := f.pending[k]; ok {
		if old.Field != c.Field {
			c.Field = "" // two different parts: say it changed
		}
		if c.Gone == nil {
			c.Gone = old.Gone // keep who saw it before the first of them
		}
	} else {
		f.order = append(f.order, k)
	}
	f.pending[k] = c
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *eventFeed) take() []store.Change {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]store.Change, 0, len(f.order))
	for _, k := range f.order {
		out = append(out, f.pending[k])
		delete(f.pending, k)
	}
	f.order = f.order[:0]
	return out
}

// run publishes queued changes until ctx ends (a background task, routes.go).
func (f *eventFeed) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		}
		for _, c := range f.take() {
			f.publish(ctx, c)
		}
	}
}

// publish reads what c names as it is now and publishes it.
func (f *eventFeed) publish(ctx context.Context, c store.Change) {
	var err error
	switch c.Coll {
	case store.CollMachines:
		err = f.machines(ctx, c)
	case store.CollStacks:
		var st model.Stack
		if st, err = current(ctx, c, f.st.Stacks().Get); err == nil {
			f.hub.Publish(events.Event{Topics: []events.Topic{events.TopicStacks}, Kind: "stack", ID: c.ID, Op: op(c), StackID: c.ID,
				Audience: events.Audience{Owner: st.Owner, Team: st.Team}})
		}
	case store.CollJobs:
		f.job(c)
	case store.CollSnapshots:
		var sn model.Snapshot
		if sn, err = current(ctx, c, f.st.Snapshots().Get); err == nil {
			f.hub.Publish(events.Event{Topics: []events.Topic{events.TopicSnapshots}, Kind: "snapshot", ID: c.ID, Op: op(c), StackID: sn.StackID,
				Audience: events.Audience{Owner: sn.Owner}}) // snapshots are their owner's (snapshots.go)
		}
	case store.CollBuckets:
		var bc model.BucketClaim
		if bc, err = current(ctx, c, f.st.BucketClaims().Get); err == nil {
			var users []string
			for u := range bc.Grants {
				users = append(users, u)
			}
			for u := range bc.ShareGrants {
				users = append(users, u)
			}
			f.hub.Publish(events.Event{Topics: []events.Topic{events.TopicBuckets}, Kind: "bucket", ID: c.ID, Op: op(c), StackID: bc.StackID,
				Audience: events.Audience{Owner: bc.Owner, Team: bc.Team, Users: users}})
		}
	}
	if err == nil || ctx.Err() != nil || !c.Deleted && errors.Is(err, store.ErrNotFound) {
		return // published; or gone meanwhile (its delete is a change of its own)
	}
	// What changed cannot be read (a delete that was not read before it): every subscriber
	// reads again rather than miss it.
	if !errors.Is(err, store.ErrNotFound) {
		f.log.WarnContext(ctx, "event: read the changed document", "coll", c.Coll, "id", c.ID, "err", err)
	}
	f.hub.Publish(events.Event{Op: events.OpResync})
}

// current is the document c names: as it was (c.Gone) when it was deleted, else read again. A
// document deleted meanwhile, or a delete that was not read before, is ErrNotFound.
func current[T any](ctx context.Context, c store.Change, get func(context.Context, string) (T, error)) (T, error) {
	if c.Deleted {
		if v, ok := c.Gone.(T); ok {
			return v, nil
		}
		var zero T
		return zero, fmt.Errorf("%s %s deleted: %w", c.Coll, c.ID, store.ErrNotFound)
	}
	return get(ctx, c.ID)
}

// op is the event op of c.
func op(c store.Change) string {
	if c.Deleted {
		return events.OpDeleted
	}
	return events.OpChanged
}

// machineEvent is the event of machine m (op), for its owner, its team's admins and the users
// it is shared with (and those in also: who saw it before a change).
func machineEvent(m model.Machine, op, field string, also []model.Machine) events.Event {
	topics := []events.Topic{events.TopicMachines}
	switch field {
	case "agent":
		topics = append(topics, events.TopicAgents)
	case "shares":
		topics = append(topics, events.TopicShares)
	}
	a := events.Audience{Owner: m.Owner, Team: m.Team}
	for _, x := range append([]model.Machine{m}, also...) {
		for _, sh := range x.Shares {
			if !slices.Contains(a.Users, sh.Username) {
				a.Users = append(a.Users, sh.Username)
			}
		}
	}
	return events.Event{Topics: topics, Kind: "machine", ID: m.ID, Op: op, StackID: m.StackID, Audience: a}
}

func (f *eventFeed) machines(ctx context.Context, c store.Change) error {
	before, _ := c.Gone.([]model.Machine)
	if c.Deleted {
		if c.Gone == nil {
			f.hub.Publish(events.Event{Op: events.OpResync}) // not read before the delete
			return nil
		}
		for _, m := range before {
			f.hub.Publish(machineEvent(m, events.OpDeleted, c.Field, nil))
		}
		return nil
	}
	var m model.Machine
	var err error
	if c.KiteID != "" {
		m, err = f.st.Machines().ByKite(ctx, c.KiteID)
	} else {
		m, err = f.st.Machines().Get(ctx, c.ID)
	}
	if err != nil {
		return err
	}
	f.hub.Publish(machineEvent(m, events.OpChanged, c.Field, before))
	return nil
}

// job publishes a job's progress when it changed (a heartbeat or a log line alone does not:
// job.watch streams the log).
func (f *eventFeed) job(c store.Change) {
	if c.Job == nil {
		return
	}
	j := c.Job
	ev := api.JobEvent{ID: j.ID, Status: api.JobStatus(j.Status), Percentage: j.Percent, Stage: j.Stage, Message: j.Message, Error: j.Error}
	f.mu.Lock()
	last, seen := f.shown[j.ID]
	if j.Status.Done() {
		delete(f.shown, j.ID)
	} else {
		f.shown[j.ID] = ev
	}
	f.mu.Unlock()
	if seen && last.Status == ev.Status && last.Percentage == ev.Percentage && last.Stage == ev.Stage && last.Message == ev.Message {
		return
	}
	stackID, _ := strings.CutPrefix(j.Target, "stack/")
	if stackID == j.Target {
		stackID = ""
	}
	f.hub.Publish(events.Event{Topics: []events.Topic{events.TopicJobs}, Kind: "job", ID: j.ID, StackID: stackID, Data: ev,
		Audience: events.Audience{Owner: j.Owner}}) // a job's owner and kloud admins (jobs.go, load)
}

// sees reports whether c may see an event for audience a: the rules of the list and get
// methods (its owner, the users named, its team's admins; kloud admins see everything).
func (c *Caller) sees(a events.Audience) bool {
	return a.Everyone || c.Admin || a.Owner == c.Username || a.Team != "" && c.TeamAdmin(a.Team) || slices.Contains(a.Users, c.Username)
}

// maxEventStreams bounds the event.watch streams one connection may hold open (a page opens
// one or two).
const maxEventStreams = 16

// eventAPI serves event.watch.
type eventAPI struct {
	hub events.Hub
	log *slog.Logger

	mu    sync.Mutex
	conns map[*kite.Conn]int // open streams by connection
}

// watch serves event.watch: a stream of the events of the topics asked (and of one stack, with
// stackId) that the caller may see, as event.notify notifications.
func (a *eventAPI) watch(ctx context.Context, c *Caller, req *kite.Request, p *api.EventWatchParams) (api.EventWatchResult, error) {
	a.mu.Lock()
	if a.conns[req.Conn] >= maxEventStreams {
		a.mu.Unlock()
		return api.EventWatchResult{}, fmt.Errorf("%d event streams are open on this connection already: %w", maxEventStreams, kite.ErrRateLimited)
	}
	if a.conns == nil {
		a.conns = map[*kite.Conn]int{}
	}
	a.conns[req.Conn]++
	a.mu.Unlock()
	topics := make([]events.Topic, 0, len(p.Topics))
	for _, t := range p.Topics {
		if !slices.Contains(topics, events.Topic(t)) {
			topics = append(topics, events.Topic(t))
		}
	}
	stackID := p.StackID
	stream := req.Conn.NewStream(api.NotifyEvent)
	sub := a.hub.Subscribe(stream.Context(), func(e events.Event) bool {
		if stackID != "" && e.StackID != stackID {
			return false
		}
		return slices.ContainsFunc(topics, e.In) && c.sees(e.Audience)
	})
	go func() {
		defer func() {
			sub.Close()
			a.mu.Lock()
			if a.conns[req.Conn]--; a.conns[req.Conn] <= 0 {
				delete(a.conns, req.Conn)
			}
			a.mu.Unlock()
		}()
		for {
			e, err := sub.Next(stream.Context())
			if err != nil {
				return
			}
			sctx, cancel := context.WithTimeout(stream.Context(), 10*time.Second)
			err = stream.Send(sctx, wireEvent(e))
			cancel()
			if err != nil {
				// A client that reads nothing for 10 s loses the stream (its page reads again
				// when it reconnects).
				ectx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				stream.End(ectx, err)
				cancel()
				return
			}
		}
	}()
	names := make([]string, len(topics))
	for i, t := range topics {
		names[i] = string(t)
	}
	return api.EventWatchResult{Subscription: stream.ID(), Topics: names}, nil
}

// wireEvent is e as event.notify carries it.
func wireEvent(e events.Event) api.Event {
	out := api.Event{Topics: []string{}, Kind: e.Kind, ID: e.ID, Op: e.Op, StackID: e.StackID, At: e.At}
	for _, t := range e.Topics {
		out.Topics = append(out.Topics, string(t))
	}
	if j, ok := e.Data.(api.JobEvent); ok {
		out.Job = &j
	}
	return out
}

// Events returns the hub this kloud publishes its changes to (Options.Events).
func (s *Server) Events() events.Hub { return s.opts.Events }

// runEvents publishes the store's changes (eventFeed.run) and the providers' status
// (watchProviders) to the event hub until ctx ends (a background task, routes.go).
func (s *Server) runEvents(ctx context.Context) {
	if s.elog != nil {
		go s.elog.run(ctx) // eventlog.go: the other replicas' events
	}
	go s.watchProviders(ctx)
	s.feed.run(ctx)
}

// providerCheckInterval is how often watchProviders looks at the providers' status.
const providerCheckInterval = 5 * time.Second

// watchProviders publishes a "providers" event whenever what provider.list shows changes (a
// plugin connecting, disconnecting or failing; a builtin becoming available or not, which only
// asking it tells): one look every providerCheckInterval for the whole kloud, instead of every
// open Providers page asking (runEvents).
func (s *Server) watchProviders(ctx context.Context) {
	t := time.NewTicker(providerCheckInterval)
	defer t.Stop()
	last := ""
	for {
		b, err := json.Marshal(s.plugins.List(true))
		if cur := string(b); err == nil && cur != last {
			if last != "" {
				s.feed.hub.Publish(events.Event{Topics: []events.Topic{events.TopicProviders}, Kind: "provider", Audience: events.Audience{Everyone: true}})
			}
			last = cur
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
