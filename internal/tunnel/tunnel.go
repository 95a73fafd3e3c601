// Package tunnel carries one TCP byte stream over a WebSocket: the data path of port
// forwarding (docs/protocol.md "Port forwarding"). klient dials the machine's port and kloud's
// attach endpoint and pipes the two; kloud relays the attachment to the CLI's WebSocket
// (`kloud port-forward`) or dials it from its HTTP proxy (a machine's web apps); the CLI pipes
// a local TCP connection into it.
//
// Framing: a binary message is data (at most MaxChunk bytes); a text message "eof" says the
// sender will send no more data (TCP half-close; the other direction goes on); a close frame
// ends both directions (CloseRefused with a reason when the far end could not be reached).
//
// Start with Conn (a net.Conn over a WebSocket) and Pipe (copies both ways until both ends
// are done).
package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// MaxChunk is the largest data message; readers accept up to MaxFrame.
const (
	MaxChunk = 32 << 10
	MaxFrame = 64 << 10
)

// EOF is the text message that half-closes a direction.
const EOF = "eof"

// Close codes of a tunnel.
const (
	CloseNormal  = websocket.StatusNormalClosure
	CloseRefused = websocket.StatusCode(4005) // the port could not be reached; the reason says why
)

// Conn is a net.Conn over a tunnel WebSocket.
type Conn struct {
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	local  net.Addr
	remote net.Addr

	rmu   sync.Mutex
	rd    io.Reader // the rest of the current data message
	rdone func()    // ends the context it is read under
	reof  bool

	wmu    sync.Mutex
	weof   bool
	closed sync.Once

	dmu                     sync.Mutex
	readDL, writeDL         time.Time
	readTimer, writeTimer   *time.Timer
	readCancel, writeCancel context.CancelFunc
}

// Addr is the address a Conn reports: "tunnel" and a description (e.g. "machine/8000").
type Addr string

func (a Addr) Network() string { return "tunnel" }
func (a Addr) String() string  { return string(a) }

// New wraps ws; name describes the far end (its RemoteAddr). The WebSocket's read limit is
// raised to MaxFrame.
func New(ws *websocket.Conn, name string) *Conn {
	ws.SetReadLimit(MaxFrame)
	ctx, cancel := context.WithCancel(context.Background())
	return &Conn{ws: ws, ctx: ctx, cancel: cancel, local: Addr("local"), remote: Addr(name)}
}

// WebSocket returns the underlying connection (to close it with a code and reason).
func (c *Conn) WebSocket() *websocket.Conn { return c.ws }

// Read reads data; io.EOF once the peer half-closed or closed normally. A data message is read
// straight into p (no copy of its own), under one context from its start to its end.
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.rd != nil {
			n, err := c.rd.Read(p)
			if errors.Is(err, io.EOF) {
				c.rd = nil
				c.rdone()
				err = nil
				if n == 0 {
					continue
				}
			} else if err != nil {
				c.rd = nil
				c.rdone()
				return n, c.mapErr(err, true)
			}
			return n, err
		}
		if c.reof {
			return 0, io.EOF
		}
		ctx, done := c.opCtx(true)
		typ, r, err := c.ws.Reader(ctx)
		if err != nil {
			done()
			if websocket.CloseStatus(err) == CloseNormal {
				c.reof = true
				return 0, io.EOF
			}
			return 0, c.mapErr(err, true)
		}
		if typ == websocket.MessageText {
			b, _ := io.ReadAll(io.LimitReader(r, 16))
			io.Copy(io.Discard, r)
			done()
			if string(b) == EOF {
				c.reof = true
				return 0, io.EOF
			}
			continue // unknown control messages are ignored
		}
		c.rd, c.rdone = r, done
	}
}

// Write sends p as one or more data messages.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.weof {
		return 0, errors.New("tunnel: write after CloseWrite")
	}
	n := 0
	for len(p) > 0 {
		k := min(len(p), MaxChunk)
		ctx, done := c.opCtx(false)
		err := c.ws.Write(ctx, websocket.MessageBinary, p[:k])
		done()
		if err != nil {
			return n, c.mapErr(err, false)
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// CloseWrite tells the peer no more data comes (it reads io.EOF); reading goes on.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.weof {
		return nil
	}
	c.weof = true
	ctx, done := c.opCtx(false)
	defer done()
	return c.ws.Write(ctx, websocket.MessageText, []byte(EOF))
}

// Close ends both directions with a normal close.
func (c *Conn) Close() error { return c.CloseWith(CloseNormal, "") }

// CloseWith ends the tunnel with code and reason (at most 123 bytes are sent).
func (c *Conn) CloseWith(code websocket.StatusCode, reason string) error {
	var err error
	c.closed.Do(func() {
		if len(reason) > 123 {
			reason = reason[:123]
		}
		// Close waits for the peer's close frame (at most 5 s); a peer that is gone just ends.
		err = c.ws.Close(code, reason)
		c.cancel()
	})
	return err
}

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

func (c *Conn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.readDL = t
	c.armLocked(true)
	return nil
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.writeDL = t
	c.armLocked(false)
	return nil
}

// armLocked (re)arms the timer that cancels a blocked read or write at its deadline.
func (c *Conn) armLocked(read bool) {
	timer, dl, cancel := &c.writeTimer, c.writeDL, c.writeCancel
	if read {
		timer, dl, cancel = &c.readTimer, c.readDL, c.readCancel
	}
	if *timer != nil {
		(*timer).Stop()
		*timer = nil
	}
	if dl.IsZero() || cancel == nil {
		return
	}
	if d := time.Until(dl); d <= 0 {
		cancel()
	} else {
		*timer = time.AfterFunc(d, cancel)
	}
}

// opCtx is the context of one read or write: cancelled by Close or the deadline. A deadline
// that passes cancels the WebSocket operation, which closes the connection (coder/websocket
// cannot resume a cancelled read), as a net.Conn whose deadline passed is of no further use in
// the tunnel's users (HTTP transports close it).
func (c *Conn) opCtx(read bool) (context.Context, func()) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.dmu.Lock()
	if read {
		c.readCancel = cancel
	} else {
		c.writeCancel = cancel
	}
	c.armLocked(read)
	c.dmu.Unlock()
	return ctx, func() {
		c.dmu.Lock()
		if read {
			c.readCancel = nil
		} else {
			c.writeCancel = nil
		}
		c.dmu.Unlock()
		cancel()
	}
}

// timeoutErr is what a read or write past its deadline returns.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "tunnel: i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func (c *Conn) mapErr(err error, read bool) error {
	if errors.Is(err, context.Canceled) && c.ctx.Err() == nil {
		c.dmu.Lock()
		dl := c.writeDL
		if read {
			dl = c.readDL
		}
		c.dmu.Unlock()
		if !dl.IsZero() && !time.Now().Before(dl) {
			return timeoutErr{}
		}
	}
	if c.ctx.Err() != nil {
		return net.ErrClosed
	}
	return err
}

// halfCloser is a connection whose write side can be closed alone.
type halfCloser interface {
	CloseWrite() error
}

// closerWith is a connection closed with a code and a reason (a *Conn).
type closerWith interface {
	CloseWith(code websocket.StatusCode, reason string) error
}

// Pipe copies a→b and b→a until both directions ended, propagating half-closes, then closes
// both. A side closed with a code and reason (a refusal: a revoked share, a limit) closes the
// other with the same, so the client at the far end is told why. It returns the first error
// that was not an orderly end.
func Pipe(a, b net.Conn) error {
	errc := make(chan error, 2)
	// readEnded[i] is closed when the copy reading from side i (a, b) ended: a copy whose write
	// failed (the other side closed) gives it a moment to pass that side's close reason on
	// before closing both, which would close this side with none.
	readEnded := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	cp := func(dst, src net.Conn, from int) {
		_, err := io.Copy(dst, src)
		close(readEnded[from])
		if hc, ok := dst.(halfCloser); ok && err == nil {
			if cerr := hc.CloseWrite(); cerr != nil {
				err = cerr
			}
		} else {
			// No half-close (or the copy failed): end the whole thing, passing on why src
			// was closed.
			var ce websocket.CloseError
			switch {
			case errors.As(err, &ce) && ce.Code != CloseNormal: // src was closed, saying why
				if cw, ok := dst.(closerWith); ok {
					cw.CloseWith(ce.Code, ce.Reason)
				}
			case err != nil:
				// A write to dst failed (net.ErrClosed: a write carries no close reason): dst
				// was closed, and the other copy reads why.
				select {
				case <-readEnded[1-from]:
				case <-time.After(time.Second):
				}
			}
			a.Close()
			b.Close()
		}
		errc <- err
	}
	go cp(b, a, 0)
	go cp(a, b, 1)
	err1 := <-errc
	err2 := <-errc
	a.Close()
	b.Close()
	if err1 != nil && !errors.Is(err1, net.ErrClosed) {
		return err1
	}
	if err2 != nil && !errors.Is(err2, net.ErrClosed) {
		return err2
	}
	return nil
}
