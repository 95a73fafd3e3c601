package kite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ClientOptions configures a Client.
type ClientOptions struct {
	// URL of the kite to keep a connection to, e.g. http://127.0.0.1:7000/kite.
	URL string
	// Auth returns the credential for each (re)connection, so a token can be renewed.
	Auth func(ctx context.Context) (Auth, error)
	// OnConnect runs after every successful handshake, before the connection is handed to
	// callers: registration hooks (kontrol.register) go here. An error drops the connection and
	// the client tries again after a backoff.
	OnConnect func(ctx context.Context, c *Conn) error
	// OnError, if set, is called with the error of every failed attempt (dial, handshake,
	// OnConnect), before the backoff: e.g. to give up on a refusal that retrying will not cure
	// (a rejected credential) by closing the client.
	OnError func(err error)
	// MinBackoff and MaxBackoff bound the exponential backoff between attempts (defaults 100ms
	// and 30s); each wait is drawn at random between MinBackoff and the current ceiling (jitter),
	// so a restarted server is not hit by every client at once.
	MinBackoff, MaxBackoff time.Duration
}

// Client keeps one connection to another kite up: it dials, handshakes, runs OnConnect, and on
// any disconnect starts again with exponential backoff and jitter. Calls wait for a connection.
type Client struct {
	k    *Kite
	opts ClientOptions

	mu      sync.Mutex
	conn    *Conn
	ready   chan struct{} // closed while conn is usable
	lastErr error
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	// Connects counts successful (re)connections.
	connects int
	started  atomic.Bool
}

// NewClient makes a client; call Start to begin connecting.
func (k *Kite) NewClient(opts ClientOptions) *Client {
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{k: k, opts: opts, ready: make(chan struct{}), ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// Start runs the connect loop in the background until Close.
func (cl *Client) Start() {
	if !cl.started.Swap(true) {
		go cl.loop()
	}
}

func (cl *Client) loop() {
	defer close(cl.done)
	attempt := 0
	for cl.ctx.Err() == nil {
		c, err := cl.connect()
		if err != nil {
			cl.mu.Lock()
			cl.lastErr = err
			cl.mu.Unlock()
			cl.k.log.Debug("kite client connect", "url", cl.opts.URL, "attempt", attempt, "err", err)
			if cl.opts.OnError != nil {
				cl.opts.OnError(err)
			}
			wait := backoff(attempt, cl.opts.MinBackoff, cl.opts.MaxBackoff)
			if connectTimedOut(err) {
				// The attempt waited out its connect timeout already (a SYN into a cut link: see
				// Options.ConnectTimeout): the next goes out at once, not after a backoff too.
				wait = cl.opts.MinBackoff
			}
			if !Sleep(cl.ctx, wait) {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		cl.mu.Lock()
		cl.conn, cl.lastErr = c, nil
		cl.connects++
		close(cl.ready)
		cl.mu.Unlock()
		select {
		case <-c.Done():
		case <-cl.ctx.Done():
			c.Close(nil)
		}
		cl.mu.Lock()
		cl.conn, cl.lastErr = nil, c.Err()
		cl.ready = make(chan struct{})
		cl.mu.Unlock()
		if cl.ctx.Err() == nil {
			cl.k.log.Info("kite connection lost, reconnecting", "url", cl.opts.URL, "err", c.Err())
			// A short pause even after a good session: a server that accepts and drops at once
			// must not be hammered.
			if !Sleep(cl.ctx, backoff(0, cl.opts.MinBackoff, cl.opts.MaxBackoff)) {
				return
			}
		}
	}
}

func (cl *Client) connect() (*Conn, error) {
	ctx, cancel := context.WithTimeout(cl.ctx, cl.k.opts.CallTimeout)
	defer cancel()
	var auth Auth
	if cl.opts.Auth != nil {
		a, err := cl.opts.Auth(ctx)
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		auth = a
	}
	c, err := cl.k.Dial(ctx, cl.opts.URL, auth)
	if err != nil {
		return nil, err
	}
	if cl.opts.OnConnect != nil {
		if err := cl.opts.OnConnect(ctx, c); err != nil {
			c.Close(err)
			return nil, fmt.Errorf("after connect: %w", err)
		}
	}
	return c, nil
}

// connectTimedOut says whether err is a TCP connect that timed out (no answer to the SYN),
// rather than one refused or a later step failing.
func connectTimedOut(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial" && oe.Timeout()
}

// backoff returns a random wait in [min, min(max, min*2^attempt)].
func backoff(attempt int, min, max time.Duration) time.Duration {
	ceil := min
	for i := 0; i < attempt && ceil < max; i++ {
		ceil *= 2
	}
	if ceil > max {
		ceil = max
	}
	if ceil <= min {
		return min
	}
	return min + time.Duration(rand.Int64N(int64(ceil-min)))
}

// Sleep waits d, or less when ctx ends first (false): the reconnecting client's wait between
// attempts, for other reconnect loops too (kloud ssh's).
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Conn waits until the client is connected (or ctx ends) and returns the connection.
func (cl *Client) Conn(ctx context.Context) (*Conn, error) {
	for {
		cl.mu.Lock()
		c, ready, lastErr := cl.conn, cl.ready, cl.lastErr
		cl.mu.Unlock()
		if c != nil && c.ctx.Err() == nil {
			return c, nil
		}
		var poll <-chan time.Time
		if c != nil {
			// Closed but not yet cleared by the connect loop (ready is still that connection's
			// closed channel): give the loop a moment instead of spinning.
			ready, poll = nil, time.After(5*time.Millisecond)
		}
		select {
		case <-poll:
		case <-ready:
		case <-cl.ctx.Done():
			return nil, fmt.Errorf("kite client for %s: %w", cl.opts.URL, ErrClosed)
		case <-ctx.Done():
			cl.mu.Lock()
			if cl.lastErr != nil {
				lastErr = cl.lastErr // the freshest reason, not the one from before the wait
			}
			cl.mu.Unlock()
			if lastErr != nil {
				return nil, fmt.Errorf("not connected to %s: %w (last error: %w)", cl.opts.URL, ctx.Err(), lastErr)
			}
			return nil, fmt.Errorf("not connected to %s: %w", cl.opts.URL, ctx.Err())
		}
	}
}

// Call waits for a connection and makes one call on it. A call whose request could not be sent
// (the connection had just closed) is sent again on the next connection; a call interrupted
// after it was sent is not retried (the server may have done the work): the error wraps
// ErrClosed.
func (cl *Client) Call(ctx context.Context, method string, params, result any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cl.k.opts.CallTimeout)
		defer cancel()
	}
	for {
		c, err := cl.Conn(ctx)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%s: %w: %w", method, ErrTimeout, err)
			}
			return err
		}
		err = c.Call(ctx, method, params, result)
		if !errors.Is(err, ErrNotSent) || ctx.Err() != nil || cl.ctx.Err() != nil {
			return err
		}
		cl.k.log.Debug("kite call not sent, retrying on the next connection", "method", method, "err", err)
		select {
		case <-c.Done():
		case <-ctx.Done():
			return err
		}
	}
}

// Connects returns how many times the client has connected.
func (cl *Client) Connects() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.connects
}

// Close stops the client and closes its connection.
func (cl *Client) Close() error {
	cl.cancel()
	if !cl.started.Swap(true) {
		close(cl.done)
	}
	<-cl.done
	return nil
}
