package kite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sourcegraph/jsonrpc2"

	"github.com/kloud-dev/kloud/kite/frame"
)

// Conn is one established kite connection. Either side may Call and Notify the other; calls
// arriving on it are served by the owning Kite's handlers, concurrently.
type Conn struct {
	k      *Kite
	rpc    *jsonrpc2.Conn
	frames frame.Stream
	dialed bool
	remote string // remote address or URL, for logs
	log    *slog.Logger

	ctx    context.Context // cancelled when the connection closes
	cancel context.CancelFunc

	ready     atomic.Bool // handshake done
	mu        sync.Mutex
	peer      Identity
	principal *Principal
	inflight  map[string]context.CancelFunc // server side: calls being served, by wire id
	subs      map[string]*Subscription      // client side: notification streams, by subscription id
	streams   map[string]*Stream            // server side: open streams, by subscription id
	values    map[any]any
	onClose   []func()
	closeErr  error
	closeOnce sync.Once

	sem    chan struct{}
	rpcSet chan struct{} // closed once rpc is assigned (jsonrpc2 may call Handle before that)
	nextID atomic.Uint64
	pingTm *time.Timer
}

func newConn(k *Kite, frames frame.Stream, dialed bool, remote string) *Conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Conn{
		k: k, frames: frames, dialed: dialed, remote: remote,
		log: k.log.With("remote", remote), ctx: ctx, cancel: cancel,
		inflight: map[string]context.CancelFunc{},
		subs:     map[string]*Subscription{},
		streams:  map[string]*Stream{},
		sem:      make(chan struct{}, k.opts.MaxConcurrent),
		rpcSet:   make(chan struct{}),
	}
	os := &objectStream{ctx: ctx, frames: frames, maxFrame: k.opts.MaxFrameSize, wtimeout: k.opts.WriteTimeout,
		onReadErr: func() { go c.Close(nil) }} // the read loop ends: no goroutine waits for that
	c.rpc = jsonrpc2.NewConn(ctx, os, c, jsonrpc2.SetLogger(discardLogger{}))
	close(c.rpcSet)
	c.schedulePing()
	return c
}

// Peer returns the identity of the other side: for a served connection the identity it claimed
// with its username (and, for kite keys, its id) replaced by what its credential proved; for a
// dialed connection the identity the server returned.
func (c *Conn) Peer() Identity {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peer
}

// Principal returns what the handshake proved about the peer, or nil before the handshake.
func (c *Conn) Principal() *Principal {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.principal
}

// Username is the peer's authenticated username ("" before the handshake).
func (c *Conn) Username() string {
	if p := c.Principal(); p != nil {
		return p.Username
	}
	return ""
}

// Remote is the other side's address (served connections: the client's host:port as the HTTP
// server saw it) or, for dialed ones, the URL dialed.
func (c *Conn) Remote() string { return c.remote }

// Dialed reports whether this side opened the connection.
func (c *Conn) Dialed() bool { return c.dialed }

// Done is closed when the connection closes.
func (c *Conn) Done() <-chan struct{} { return c.ctx.Done() }

// Context is cancelled when the connection closes.
func (c *Conn) Context() context.Context { return c.ctx }

// Err returns why the connection closed, once it has.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// SetValue attaches a value to the connection (e.g. kontrol's registration).
func (c *Conn) SetValue(key, v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.values == nil {
		c.values = map[any]any{}
	}
	c.values[key] = v
}

// OnClose registers f to run once the connection has closed (at once if it already has).
func (c *Conn) OnClose(f func()) {
	c.mu.Lock()
	if c.ctx.Err() == nil {
		c.onClose = append(c.onClose, f)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	f()
}

// Value returns a value set with SetValue.
func (c *Conn) Value(key any) any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.values[key]
}

// Close closes the connection. The reason, if any, is kept as Err and logged.
func (c *Conn) Close(reason error) error {
	c.closeOnce.Do(func() {
		if reason == nil {
			reason = ErrClosed
		}
		c.mu.Lock()
		c.closeErr = reason
		subs := c.subs
		c.subs = map[string]*Subscription{}
		streams := c.streams
		c.streams = map[string]*Stream{}
		if c.pingTm != nil {
			c.pingTm.Stop()
		}
		c.mu.Unlock()
		code, msg := frame.CloseNormal, ""
		if !errors.Is(reason, ErrClosed) {
			code, msg = frame.CloseGoingAway, truncate(reason.Error(), 120)
		}
		if errors.Is(reason, errDeadPeer) {
			c.frames.Close(frame.CloseNow, "") // no close handshake with a peer that stopped answering
		} else {
			c.frames.Close(code, msg)
		}
		c.rpc.Close()
		c.cancel()
		for _, s := range subs {
			s.finish(fmt.Errorf("%w: %w", ErrClosed, reason))
		}
		for _, s := range streams {
			s.stop()
		}
		c.mu.Lock()
		hooks := c.onClose
		c.onClose = nil
		c.mu.Unlock()
		for _, f := range hooks {
			f()
		}
		c.k.forget(c)
		c.log.Debug("kite connection closed", "reason", reason)
	})
	return nil
}

var errDeadPeer = errors.New("peer did not answer ping")

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (c *Conn) schedulePing() {
	iv := c.k.opts.PingInterval
	if iv <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pingTm = time.AfterFunc(iv, func() {
		ctx, cancel := context.WithTimeout(c.ctx, c.k.opts.PingTimeout)
		defer cancel()
		if err := c.frames.Ping(ctx); err != nil {
			if c.ctx.Err() == nil {
				c.Close(fmt.Errorf("%w within %s: %w", errDeadPeer, c.k.opts.PingTimeout, err))
			}
			return
		}
		c.mu.Lock()
		if c.ctx.Err() == nil {
			c.pingTm.Reset(iv)
		}
		c.mu.Unlock()
	})
}

// Call sends a request and waits for its response, decoding the result into result (which may
// be nil). Without a deadline on ctx the Kite's CallTimeout applies. If ctx ends first, the peer
// is told to cancel the call (kite.cancel) and the error wraps ErrTimeout.
func (c *Conn) Call(ctx context.Context, method string, params, result any) error {
	if _, ok := ctx.Deadline(); !ok && c.k.opts.CallTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.k.opts.CallTimeout)
		defer cancel()
	}
	budget := c.k.opts.RateLimitedRetry
	for {
		err := c.call(ctx, method, params, result)
		wait, ok := retryAfter(err)
		if !ok || wait > budget {
			return err
		}
		budget -= wait
		c.k.log.Debug("kite call rate limited, sending it again", "method", method, "wait", wait)
		if !Sleep(ctx, wait) {
			return err
		}
	}
}

// retryAfter is the wait a rate-limited refusal names (its details' retryAfterMs; 1s when it
// names none), and whether err is one.
func retryAfter(err error) (time.Duration, bool) {
	var ke *Error
	if !errors.Is(err, ErrRateLimited) || !errors.As(err, &ke) {
		return 0, false
	}
	wait := time.Second
	if ke.Data != nil {
		if d, ok := ke.Data.Details.(map[string]any); ok {
			if ms, ok := d["retryAfterMs"].(float64); ok && ms > 0 {
				wait = time.Duration(ms) * time.Millisecond
			}
		}
	}
	return wait, true
}

func (c *Conn) call(ctx context.Context, method string, params, result any) error {
	id := jsonrpc2.ID{Num: c.nextID.Add(1)}
	w, err := c.rpc.DispatchCall(ctx, method, params, jsonrpc2.PickID(id))
	if err != nil {
		return c.sendErr(method, err)
	}
	err = w.Wait(ctx, result)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		nctx, cancel := context.WithTimeout(c.ctx, time.Second)
		c.rpc.Notify(nctx, "kite.cancel", map[string]any{"id": id.Num})
		cancel()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("no response to %s: %w", method, ErrTimeout)
		}
		return fmt.Errorf("%s: %w", method, ctx.Err())
	case errors.Is(err, jsonrpc2.ErrClosed):
		return fmt.Errorf("%s: %w", method, c.closedErr())
	}
	var je *jsonrpc2.Error
	if errors.As(err, &je) {
		return fromWire(err)
	}
	return fmt.Errorf("%s: %w", method, err)
}

func (c *Conn) closedErr() error {
	if err := c.Err(); err != nil && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return ErrClosed
}

func (c *Conn) sendErr(method string, err error) error {
	switch {
	case errors.Is(err, jsonrpc2.ErrClosed):
		return fmt.Errorf("%s: %w: %w", method, ErrNotSent, c.closedErr())
	case errors.Is(err, errWriteTooLarge):
		return fmt.Errorf("%s: request exceeds %d bytes: %w", method, c.k.opts.MaxFrameSize, ErrTooLarge)
	}
	if c.ctx.Err() != nil {
		return fmt.Errorf("%s: %w: %w", method, ErrNotSent, c.closedErr())
	}
	// A failed write leaves the connection unusable (a frame may be half written): close it so
	// that a Client reconnects at once instead of waiting for the read loop to notice.
	c.Close(fmt.Errorf("write: %w", err))
	return fmt.Errorf("%s: send: %w: %w: %w", method, ErrNotSent, ErrClosed, err)
}

// Notify sends a notification (no response).
func (c *Conn) Notify(ctx context.Context, method string, params any) error {
	if err := c.rpc.Notify(ctx, method, params); err != nil {
		return c.sendErr(method, err)
	}
	return nil
}

// Handle implements jsonrpc2.Handler. Notifications and the handshake are handled in the read
// loop, in order; every other request runs in its own goroutine (at most MaxConcurrent at once
// per connection: beyond that the read loop waits, which pushes back on the peer).
func (c *Conn) Handle(ctx context.Context, _ *jsonrpc2.Conn, req *jsonrpc2.Request) {
	<-c.rpcSet
	if req.Notif {
		c.handleNotification(req)
		return
	}
	if req.Method == "kite.handshake" {
		c.serve(ctx, req)
		return
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	go func() {
		defer func() { <-c.sem }()
		c.serve(ctx, req)
	}()
}

func (c *Conn) serve(ctx context.Context, req *jsonrpc2.Request) {
	start := time.Now()
	ctx = WithRequestInfo(ctx, RequestInfo{ID: NewRequestID(), Method: req.Method, User: c.Username()})
	c.log.DebugContext(ctx, "call") // c.log carries the remote address
	res, err := c.dispatch(ctx, req)
	if o := c.k.opts.Observer; o != nil {
		method := req.Method
		if c.k.lookup(method) == nil {
			method = UnknownMethod
		}
		var code int64
		if err != nil {
			code = ToWire(err).Code
		}
		o.Served(method, code, time.Since(start))
	}
	if err != nil {
		we := ToWire(err)
		lv := slog.LevelDebug // the caller hears of it; a store outage is logged once, not per call
		if we.Code == CodeInternal {
			lv = slog.LevelError
		}
		c.log.Log(ctx, lv, "call failed", "code", we.Code, "err", err)
		c.rpc.ReplyWithError(ctx, req.ID, we)
		return
	}
	if err := c.rpc.Reply(ctx, req.ID, res); err != nil {
		if errors.Is(err, errWriteTooLarge) {
			c.rpc.ReplyWithError(ctx, req.ID, ToWire(fmt.Errorf("result of %s exceeds %d bytes: %w",
				req.Method, c.k.opts.MaxFrameSize, ErrTooLarge)))
			return
		}
		c.log.Debug("reply", "method", req.Method, "err", err)
	}
}

func (c *Conn) dispatch(ctx context.Context, req *jsonrpc2.Request) (res any, err error) {
	m := c.k.lookup(req.Method)
	authed := c.dialed || c.ready.Load() // a kite we dialed is trusted: we chose to talk to it
	if m == nil {
		if !authed {
			return nil, fmt.Errorf("call kite.handshake first: %w", ErrAuth)
		}
		return nil, fmt.Errorf("%q: %w", req.Method, ErrMethodNotFound)
	}
	if !m.public && !authed {
		return nil, fmt.Errorf("call kite.handshake before %s: %w", req.Method, ErrAuth)
	}
	if m.limiter != nil && !m.limiter.allow() {
		return nil, fmt.Errorf("%s: the maximum request rate is exceeded: %w", req.Method, ErrRateLimited)
	}
	timeout := c.k.opts.HandlerTimeout
	if m.timeout > 0 {
		timeout = m.timeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	key := req.ID.String()
	c.mu.Lock()
	c.inflight[key] = cancel
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.inflight, key)
		c.mu.Unlock()
	}()
	r := &Request{Method: req.Method, Conn: c}
	if req.Params != nil {
		r.Params = *req.Params
	}
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("kite handler panicked", "method", req.Method, "panic", p, "stack", string(debug.Stack()))
			res, err = nil, fmt.Errorf("%s: handler panicked: %w", req.Method, ErrInternal)
		}
	}()
	return m.h.ServeKite(ctx, r)
}

func (c *Conn) handleNotification(req *jsonrpc2.Request) {
	var params json.RawMessage
	if req.Params != nil {
		params = *req.Params
	}
	switch req.Method {
	case "kite.cancel":
		var p struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(params, &p) == nil {
			var id jsonrpc2.ID
			if id.UnmarshalJSON(p.ID) == nil {
				c.mu.Lock()
				cancel := c.inflight[id.String()]
				c.mu.Unlock()
				if cancel != nil {
					cancel()
				}
			}
		}
		return
	case "kite.unsubscribe":
		var p struct {
			Subscription string `json:"subscription"`
		}
		if json.Unmarshal(params, &p) == nil {
			c.mu.Lock()
			s := c.streams[p.Subscription]
			delete(c.streams, p.Subscription)
			c.mu.Unlock()
			if s != nil {
				s.stop()
			}
		}
		return
	}
	if !c.dialed && !c.ready.Load() {
		return
	}
	var env struct {
		Subscription string `json:"subscription"`
	}
	if len(params) > 0 && params[0] == '{' && json.Unmarshal(params, &env) == nil && env.Subscription != "" {
		c.deliver(env.Subscription, req.Method, params)
		return
	}
	if h := c.k.lookupNotification(req.Method); h != nil {
		h(c, params)
	}
}

func randomID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// discardLogger silences jsonrpc2's own logging; the Conn logs what matters through slog.
type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}
