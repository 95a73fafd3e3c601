package kite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A stream is a series of notifications from server to client tied to a subscription id that
// the call which opened it returned. Every notification's params are
//
//	{"subscription": "<id>", "data": <payload>}            while it runs
//	{"subscription": "<id>", "end": true, "error": <err?>}  once, at the end
//
// The client stops a stream early with the notification kite.unsubscribe {"subscription": id}.

// Event is one notification of a stream.
type Event struct {
	Method string          // the notification method, e.g. kontrol.event
	Data   json.RawMessage // the payload
}

// Subscription receives a stream on the client side. Notifications that arrive before Subscribe
// is called (they may overtake the response that carries the id) are kept and delivered.
type Subscription struct {
	id    string
	c     *Conn
	ch    chan Event
	done  chan struct{}
	once  sync.Once
	err   error
	born  time.Time
	taken bool
}

// subscriptionBuffer bounds the events queued for a subscriber. A consumer that falls this far
// behind loses the stream (Err says so) rather than growing memory without bound.
const subscriptionBuffer = 4096

// Subscribe returns the subscription with the given id (from the call that opened the stream).
func (c *Conn) Subscribe(id string) *Subscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.subs[id]
	if s == nil {
		s = c.newSubscriptionLocked(id)
	}
	s.taken = true
	select {
	case <-s.done:
		delete(c.subs, id)
	default:
	}
	return s
}

func (c *Conn) newSubscriptionLocked(id string) *Subscription {
	s := &Subscription{id: id, c: c, ch: make(chan Event, subscriptionBuffer), done: make(chan struct{}), born: time.Now()}
	if c.ctx.Err() != nil {
		s.finish(ErrClosed)
		return s
	}
	c.subs[id] = s
	// Forget streams nobody claimed within a minute (a call that failed after opening one).
	for k, o := range c.subs {
		if !o.taken && time.Since(o.born) > time.Minute {
			delete(c.subs, k)
		}
	}
	return s
}

func (c *Conn) deliver(id, method string, params json.RawMessage) {
	var n struct {
		Data  json.RawMessage `json:"data"`
		End   bool            `json:"end"`
		Error *Error          `json:"error"`
	}
	if json.Unmarshal(params, &n) != nil {
		return
	}
	c.mu.Lock()
	s := c.subs[id]
	if s == nil {
		if c.ctx.Err() != nil {
			c.mu.Unlock()
			return
		}
		s = c.newSubscriptionLocked(id)
	}
	if n.End && s.taken {
		delete(c.subs, id) // an unclaimed ended stream stays until Subscribe collects it
	}
	c.mu.Unlock()
	if n.End {
		var err error
		if n.Error != nil {
			err = n.Error
		}
		s.finish(err)
		return
	}
	select {
	case s.ch <- Event{Method: method, Data: n.Data}:
	default:
		c.mu.Lock()
		delete(c.subs, id)
		c.mu.Unlock()
		s.finish(fmt.Errorf("subscription %s: consumer fell %d events behind: %w", id, subscriptionBuffer, ErrTooLarge))
		c.Notify(c.ctx, "kite.unsubscribe", map[string]string{"subscription": id})
	}
}

func (s *Subscription) finish(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.done)
	})
}

// ID returns the subscription id.
func (s *Subscription) ID() string { return s.id }

// Next returns the next event. At the end of the stream it returns io.EOF-like ErrStreamEnded
// (or the error the stream ended with, or the connection's error).
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	select {
	case e := <-s.ch:
		return e, nil
	default:
	}
	select {
	case e := <-s.ch:
		return e, nil
	case <-s.done:
		select {
		case e := <-s.ch:
			return e, nil
		default:
		}
		if s.err != nil {
			return Event{}, s.err
		}
		return Event{}, ErrStreamEnded
	case <-ctx.Done():
		return Event{}, ctx.Err()
	}
}

// ErrStreamEnded is returned by Next after a stream ended without error.
var ErrStreamEnded = errors.New("kite: stream ended")

// Done is closed when the stream has ended (events may still be queued).
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Close stops the stream and tells the server.
func (s *Subscription) Close() {
	s.c.mu.Lock()
	delete(s.c.subs, s.id)
	s.c.mu.Unlock()
	s.finish(nil)
	ctx, cancel := context.WithTimeout(s.c.ctx, time.Second)
	defer cancel()
	s.c.Notify(ctx, "kite.unsubscribe", map[string]string{"subscription": s.id})
}

// Stream is the server side of a stream. Open one with Conn.NewStream, return its ID in the
// call's result, then Send until the work ends and End once.
type Stream struct {
	id     string
	method string
	c      *Conn
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	ended  bool
}

// NewStream opens a stream whose notifications use method.
func (c *Conn) NewStream(method string) *Stream {
	ctx, cancel := context.WithCancel(c.ctx)
	s := &Stream{id: randomID(), method: method, c: c, ctx: ctx, cancel: cancel}
	c.mu.Lock()
	c.streams[s.id] = s
	c.mu.Unlock()
	return s
}

// ID returns the subscription id to hand to the client.
func (s *Stream) ID() string { return s.id }

// Done is closed when the client unsubscribed, the connection closed, or End was called.
func (s *Stream) Done() <-chan struct{} { return s.ctx.Done() }

// Context is cancelled like Done.
func (s *Stream) Context() context.Context { return s.ctx }

func (s *Stream) stop() { s.cancel() }

// Send sends one event. It blocks while the connection's writer is busy, so a slow client slows
// the producer instead of growing a queue.
func (s *Stream) Send(ctx context.Context, data any) error {
	if s.ctx.Err() != nil {
		return fmt.Errorf("stream %s: %w", s.id, ErrClosed)
	}
	return s.c.Notify(ctx, s.method, struct {
		Subscription string `json:"subscription"`
		Data         any    `json:"data"`
	}{s.id, data})
}

// End ends the stream, with err (nil for a normal end) passed to the client.
func (s *Stream) End(ctx context.Context, err error) error {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return nil
	}
	s.ended = true
	s.mu.Unlock()
	defer func() {
		s.c.mu.Lock()
		delete(s.c.streams, s.id)
		s.c.mu.Unlock()
		s.cancel()
	}()
	if s.c.ctx.Err() != nil {
		return nil
	}
	return s.c.Notify(ctx, s.method, struct {
		Subscription string `json:"subscription"`
		End          bool   `json:"end"`
		Error        any    `json:"error,omitempty"`
	}{s.id, true, ToWire(err)})
}
