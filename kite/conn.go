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
//
// It reads and writes the wire itself (stream.go): one read loop decodes each frame once and
// routes it (a request to its handler, a response to the waiting Call); every write is encoded
// once into a pooled buffer and written under one lock, watched by one timer per connection
// (WriteTimeout) instead of a context per frame.
type Conn struct {
	k      *Kite
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
	inflight  map[jsonrpc2.ID]*callCtx // server side: calls being served, by wire id
	pending   map[uint64]*pendingCall  // client side: calls waiting for their response, by id
	subs      map[string]*Subscription // client side: notification streams, by subscription id
	streams   map[string]*Stream       // server side: open streams, by subscription id
	values    map[any]any
	onClose   []func()
	closeErr  error
	closeOnce sync.Once

	wmu    sync.Mutex  // one frame written at a time
	wtimer *time.Timer // armed while a frame is being written: closes a connection whose write is stuck
	// ctimer ends the calls that wait past CallTimeout (those whose ctx has no deadline): one
	// timer per connection, armed (ctArmed, under mu) while such calls are pending.
	ctimer  *time.Timer
	ctArmed bool

	sem    chan struct{}
	nextID atomic.Uint64
	pingTm *time.Timer
}

// response is what a Call waits for: the raw result, or the error, or that CallTimeout passed.
type response struct {
	result  json.RawMessage
	err     *jsonrpc2.Error
	timeout bool
}

// pendingCall is a call waiting for its response. They are pooled: one is reused only once its
// response was received (nothing else can send on ch then).
type pendingCall struct {
	ch       chan response // buffered: the sender never waits
	deadline time.Time     // CallTimeout's; zero when the caller's ctx bounds the call
}

var pendingCalls = sync.Pool{New: func() any { return &pendingCall{ch: make(chan response, 1)} }}

func newConn(k *Kite, frames frame.Stream, dialed bool, remote string) *Conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Conn{
		k: k, frames: frames, dialed: dialed, remote: remote,
		log: k.log.With("remote", remote), ctx: ctx, cancel: cancel,
		inflight: map[jsonrpc2.ID]*callCtx{},
		pending:  map[uint64]*pendingCall{},
		subs:     map[string]*Subscription{},
		streams:  map[string]*Stream{},
		sem:      make(chan struct{}, k.opts.MaxConcurrent),
	}
	c.wtimer = time.AfterFunc(time.Hour, func() {
		c.Close(fmt.Errorf("%w: a frame was not written within %s", errStuck, k.opts.WriteTimeout))
	})
	c.wtimer.Stop()
	go c.readLoop()
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
		if c.ctimer != nil {
			c.ctimer.Stop()
		}
		c.mu.Unlock()
		code, msg := frame.CloseNormal, ""
		if !errors.Is(reason, ErrClosed) {
			code, msg = frame.CloseGoingAway, truncate(reason.Error(), 120)
		}
		if errors.Is(reason, errDeadPeer) || errors.Is(reason, errStuck) {
			c.frames.Close(frame.CloseNow, "") // no close handshake with a peer that stopped answering
		} else {
			c.frames.Close(code, msg)
		}
		c.cancel()
		c.mu.Lock()
		pending := c.pending
		c.pending = map[uint64]*pendingCall{}
		inflight := c.inflight
		c.inflight = map[jsonrpc2.ID]*callCtx{}
		c.mu.Unlock()
		for _, pc := range pending {
			close(pc.ch) // the Call returns ErrClosed
		}
		for _, cc := range inflight {
			cc.cancel(context.Canceled)
		}
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

var (
	errDeadPeer = errors.New("peer did not answer ping")
	errStuck    = errors.New("write timed out")
	// errNotOpen is writeFrame's error on a connection that has closed.
	errNotOpen = errors.New("kite: connection is closed")
)

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
	var deadline time.Time // CallTimeout, kept by the connection's timer rather than a ctx per call
	if _, ok := ctx.Deadline(); !ok && c.k.opts.CallTimeout > 0 {
		deadline = time.Now().Add(c.k.opts.CallTimeout)
	}
	budget := c.k.opts.RateLimitedRetry
	for {
		err := c.call(ctx, deadline, method, params, result)
		wait, ok := retryAfter(err)
		if !ok || wait > budget || (!deadline.IsZero() && wait >= time.Until(deadline)) {
			return err
		}
		budget -= wait
		c.k.log.Debug("kite call rate limited, sending it again", "method", method, "wait", wait)
		if !Sleep(ctx, wait) {
			return err
		}
	}
}

// expireCalls is ctimer's function: it ends the calls past their deadline and arms the timer
// for the next one.
func (c *Conn) expireCalls() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var next time.Time
	for id, pc := range c.pending {
		switch {
		case pc.deadline.IsZero():
		case !now.Before(pc.deadline):
			delete(c.pending, id)
			pc.ch <- response{timeout: true}
		case next.IsZero() || pc.deadline.Before(next):
			next = pc.deadline
		}
	}
	c.ctArmed = !next.IsZero() && c.ctx.Err() == nil
	if c.ctArmed {
		c.ctimer.Reset(next.Sub(now))
	}
}

// retryAfter is the wait a rate-limited refusal names (its details' retryAfterMs; 1s when it
// names none), and whether err is one.
func retryAfter(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
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

func (c *Conn) call(ctx context.Context, deadline time.Time, method string, params, result any) error {
	id := c.nextID.Add(1)
	pc := pendingCalls.Get().(*pendingCall)
	pc.deadline = deadline
	c.mu.Lock()
	if c.ctx.Err() != nil {
		c.mu.Unlock()
		pendingCalls.Put(pc)
		return c.sendErr(method, errNotOpen)
	}
	c.pending[id] = pc
	if !deadline.IsZero() && !c.ctArmed {
		c.ctArmed = true
		if c.ctimer == nil { // made by the first such call: a served connection seldom calls back
			c.ctimer = time.AfterFunc(time.Until(deadline), c.expireCalls)
		} else {
			c.ctimer.Reset(time.Until(deadline))
		}
	}
	c.mu.Unlock()
	w := getBuf()
	if err := w.request(id, method, params); err != nil {
		putBuf(w)
		c.forgetCall(id)
		return fmt.Errorf("%s: encode params: %w", method, err) // nothing was sent
	}
	err := c.writeFrame(w.b.Bytes())
	putBuf(w)
	if err != nil {
		c.forgetCall(id)
		return c.sendErr(method, err)
	}
	var r response
	var ok bool
	select {
	case r, ok = <-pc.ch:
		if !ok {
			return fmt.Errorf("%s: %w", method, c.closedErr())
		}
		pendingCalls.Put(pc) // received: nothing else sends on it
	case <-ctx.Done():
		c.forgetCall(id)
		c.Notify(c.ctx, "kite.cancel", map[string]any{"id": id})
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("no response to %s: %w", method, ErrTimeout)
		}
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
	switch {
	case r.timeout:
		c.Notify(c.ctx, "kite.cancel", map[string]any{"id": id})
		return fmt.Errorf("no response to %s: %w", method, ErrTimeout)
	case r.err != nil:
		return fromWire(r.err)
	case result != nil:
		if err := json.Unmarshal(r.result, result); err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
	}
	return nil
}

func (c *Conn) forgetCall(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// writeFrame writes one encoded frame. The frame may be reused once it returns.
func (c *Conn) writeFrame(b []byte) error {
	if int64(len(b)) > c.k.opts.MaxFrameSize {
		return errWriteTooLarge
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.ctx.Err() != nil {
		return errNotOpen
	}
	c.wtimer.Reset(c.k.opts.WriteTimeout)
	// No cancellation on the write: the timer closes the stream if it sticks, and a ctx with a
	// Done channel costs coder/websocket a context.AfterFunc per write.
	err := c.frames.WriteFrame(context.Background(), b)
	c.wtimer.Stop()
	return err
}

func (c *Conn) closedErr() error {
	if err := c.Err(); err != nil && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return ErrClosed
}

func (c *Conn) sendErr(method string, err error) error {
	switch {
	case errors.Is(err, errNotOpen):
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
	w := getBuf()
	defer putBuf(w)
	if err := w.request(0, method, params); err != nil {
		return fmt.Errorf("%s: encode params: %w", method, err) // nothing was sent
	}
	if err := c.writeFrame(w.b.Bytes()); err != nil {
		return c.sendErr(method, err)
	}
	return nil
}

// readLoop reads and routes frames until the stream fails (the connection is then closed).
func (c *Conn) readLoop() {
	for {
		// No cancellation on the read: Close closes the frames, which ends a blocked read, and a
		// ctx with a Done channel costs coder/websocket a context.AfterFunc on every read.
		b, err := c.frames.ReadFrame(context.Background())
		if err != nil {
			c.Close(nil)
			return
		}
		c.route(b)
	}
}

// route handles one frame (valid until it returns): a malformed one is answered with -32700 or
// -32600 and the connection stays up. Notifications and the handshake are handled here, in
// order; every other request runs in its own goroutine (at most MaxConcurrent at once per
// connection: beyond that the read loop waits, which pushes back on the peer).
func (c *Conn) route(b []byte) {
	var m message
	id, code, msg := parse(b, &m)
	switch {
	case code == dropFrame:
		return
	case code != 0:
		c.replyError(id, ToWire(fmt.Errorf("%s: %w", msg, codeErr(code))))
		return
	case m.Method == nil:
		c.routeResponse(&m)
		return
	}
	req := &incoming{method: *m.Method, params: m.Params, rawID: m.ID}
	var ok bool
	if req.id, ok = parseID(m.ID); !ok {
		c.handleNotification(req.method, req.params)
		return
	}
	if req.method == "kite.handshake" {
		c.serve(req)
		return
	}
	select {
	case c.sem <- struct{}{}:
	case <-c.ctx.Done():
		return
	}
	go func() {
		defer func() { <-c.sem }()
		c.serve(req)
	}()
}

// incoming is a request being served.
type incoming struct {
	method string
	params json.RawMessage
	rawID  json.RawMessage // echoed in the response as the peer wrote it
	id     jsonrpc2.ID
}

func (c *Conn) routeResponse(m *message) {
	id, ok := parseID(m.ID)
	if !ok || id.IsString {
		return // not one of ours: this side numbers its calls
	}
	var r response
	if len(m.Error) > 0 && string(m.Error) != "null" {
		e, err := decodeError(m.Error)
		if err != nil {
			return // not a JSON-RPC error object: dropped, as a broken response is
		}
		r.err = e
	} else {
		r.result = m.Result
		if r.result == nil {
			r.result = json.RawMessage("null")
		}
	}
	c.mu.Lock()
	pc := c.pending[id.Num]
	delete(c.pending, id.Num)
	c.mu.Unlock()
	if pc != nil {
		pc.ch <- r // buffered, and deleted above: the one send, never blocks
	}
}

func (c *Conn) replyError(id json.RawMessage, we *jsonrpc2.Error) {
	w := getBuf()
	w.error(id, we)
	if err := c.writeFrame(w.b.Bytes()); err != nil {
		c.log.Debug("reply", "err", err)
	}
	putBuf(w)
}

func (c *Conn) serve(req *incoming) {
	start := time.Now()
	m := c.k.lookup(req.method)
	timeout := c.k.opts.HandlerTimeout
	if m != nil && m.timeout > 0 {
		timeout = m.timeout
	}
	ctx := newCallCtx(req.method, c.Username(), timeout)
	c.mu.Lock()
	if c.ctx.Err() != nil {
		ctx.cancel(context.Canceled)
	} else {
		c.inflight[req.id] = ctx
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.inflight[req.id] == ctx {
			delete(c.inflight, req.id)
		}
		c.mu.Unlock()
		ctx.cancel(context.Canceled)
	}()
	c.log.DebugContext(ctx, "call") // c.log carries the remote address
	res, err := c.dispatch(ctx, m, req)
	if o := c.k.opts.Observer; o != nil {
		method := req.method
		if m == nil {
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
		c.replyError(req.rawID, we)
		return
	}
	w := getBuf()
	defer putBuf(w)
	if err := w.result(req.rawID, res); err != nil {
		c.log.Error("kite: encode result", "method", req.method, "err", err)
		c.replyError(req.rawID, ToWire(fmt.Errorf("result of %s: %w: %w", req.method, err, ErrInternal)))
		return
	}
	if err := c.writeFrame(w.b.Bytes()); err != nil {
		if errors.Is(err, errWriteTooLarge) {
			c.replyError(req.rawID, ToWire(fmt.Errorf("result of %s exceeds %d bytes: %w",
				req.method, c.k.opts.MaxFrameSize, ErrTooLarge)))
			return
		}
		c.log.Debug("reply", "method", req.method, "err", err)
	}
}

func (c *Conn) dispatch(ctx context.Context, m *method, req *incoming) (res any, err error) {
	authed := c.dialed || c.ready.Load() // a kite we dialed is trusted: we chose to talk to it
	if m == nil {
		if !authed {
			return nil, fmt.Errorf("call kite.handshake first: %w", ErrAuth)
		}
		return nil, fmt.Errorf("%q: %w", req.method, ErrMethodNotFound)
	}
	if !m.public && !authed {
		return nil, fmt.Errorf("call kite.handshake before %s: %w", req.method, ErrAuth)
	}
	if m.limiter != nil && !m.limiter.allow() {
		return nil, fmt.Errorf("%s: the maximum request rate is exceeded: %w", req.method, ErrRateLimited)
	}
	r := &Request{Method: req.method, Params: req.params, Conn: c}
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("kite handler panicked", "method", req.method, "panic", p, "stack", string(debug.Stack()))
			res, err = nil, fmt.Errorf("%s: handler panicked: %w", req.method, ErrInternal)
		}
	}()
	return m.h.ServeKite(ctx, r)
}

func (c *Conn) handleNotification(method string, params json.RawMessage) {
	switch method {
	case "kite.cancel":
		var p struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(params, &p) == nil {
			if id, ok := parseCancelID(p.ID); ok {
				c.mu.Lock()
				cc := c.inflight[id]
				c.mu.Unlock()
				if cc != nil {
					cc.cancel(context.Canceled)
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
		c.deliver(env.Subscription, method, params)
		return
	}
	if h := c.k.lookupNotification(method); h != nil {
		h(c, params)
	}
}

func randomID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
