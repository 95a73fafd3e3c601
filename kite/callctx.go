package kite

import (
	"context"
	"sync"
	"time"
)

// callCtx is the context a served call's handler gets: cancelled by kite.cancel, by the
// connection closing and at the method's deadline, and carrying the call's RequestInfo. It
// costs no timer, channel or request id until something asks for them (Done, AfterFunc, Value):
// a handler that never waits on its ctx pays for none (docs/ARCHITECTURE.md §2). It implements
// AfterFunc, so contexts derived from it (context.WithTimeout in a handler) register with it
// instead of each starting a goroutine.
type callCtx struct {
	method, user string
	deadline     time.Time

	mu     sync.Mutex
	id     string // request id, made when first asked for
	done   chan struct{}
	err    error
	timer  *time.Timer
	afters map[*func()]struct{}
}

var _ context.Context = (*callCtx)(nil)

func newCallCtx(method, user string, timeout time.Duration) *callCtx {
	return &callCtx{method: method, user: user, deadline: time.Now().Add(timeout)}
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Done makes the channel (and starts the deadline's timer) when first asked for.
func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		} else {
			c.armLocked()
		}
	}
	return c.done
}

func (c *callCtx) armLocked() {
	if c.timer == nil {
		c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.cancel(context.DeadlineExceeded) })
	}
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err == nil && !time.Now().Before(c.deadline) {
		c.cancel(context.DeadlineExceeded)
		return context.DeadlineExceeded
	}
	return err
}

func (c *callCtx) Value(key any) any {
	if _, ok := key.(requestInfoKey); !ok {
		return nil // the connection's context, its parent, carries no values
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.id == "" {
		c.id = NewRequestID()
	}
	return RequestInfo{ID: c.id, Method: c.method, User: c.user}
}

// AfterFunc runs f in its own goroutine once c is cancelled (context.AfterFunc's contract);
// stop unregisters it.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	c.armLocked()
	if c.afters == nil {
		c.afters = map[*func()]struct{}{}
	}
	key := &f
	c.afters[key] = struct{}{}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.afters[key]
		delete(c.afters, key)
		return ok
	}
}

// cancel ends c with err (the first reason stays); it is what kite.cancel, the connection's
// close and the deadline call, and what ends the call once its handler returned.
func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	afters := c.afters
	c.afters = nil
	c.mu.Unlock()
	for f := range afters {
		go (*f)()
	}
}

func (c *callCtx) String() string { return "kite.callCtx(" + c.method + ")" }
