// Package tunnel carries one TCP byte stream over a WebSocket: the data path of port
// forwarding and SSH (docs/protocol.md "Port forwarding"). klient dials the machine's port and
// kloud's attach endpoint and pipes the two; kloud relays the attachment to the CLI's WebSocket
// (`kloud port-forward`, `kloud ssh`) or dials it from its HTTP proxy (a machine's web apps);
// the CLI pipes a local TCP connection into it.
//
// Framing: a binary message is data; a text message "eof" says the sender will send no more
// data (TCP half-close; the other direction goes on); a close frame ends both directions
// (CloseRefused with a reason when the far end could not be reached).
//
// Message size: a reader accepts messages up to ReadLimit and says so in its handshake
// (LimitHeader in the dial request or in the 101 answer: Header; New reads the peer's); a
// writer sends messages of up to MaxChunk to a peer that said nothing (a build older than the
// header, which accepted MaxFrame) and up to BigChunk to one that reads that much. Larger
// messages are fewer system calls per byte in every process on the path (issue 25: with 32 KiB
// messages kloud's relay did 0.24× a direct loopback connection, most of its time in read and
// write calls).
//
// Deadlines: reads and writes run without a context of their own (coder/websocket registers a
// timeout on every operation under a cancellable one). A deadline that passes while one blocks
// closes the WebSocket, as coder/websocket cannot resume a cut read, and it returns a timeout
// error; a deadline already past when one starts fails it at once and leaves the connection
// usable.
//
// Start with Conn (a net.Conn over a WebSocket) and Pipe (copies both ways until both ends
// are done).
package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Message sizes.
const (
	// MaxChunk is the largest data message sent to a peer that did not say what it reads.
	MaxChunk = 32 << 10
	// MaxFrame is what readers before LimitHeader accepted (klients of older builds).
	MaxFrame = 64 << 10
	// BigChunk is the largest data message sent to a peer that reads it, and the size of
	// Pipe's copy buffers.
	BigChunk = 256 << 10
	// ReadLimit is the largest message this build reads.
	ReadLimit = 1 << 20
)

// LimitHeader names, in a tunnel's WebSocket handshake, the largest message its sender reads.
const LimitHeader = "Kloud-Tunnel-Read-Limit"

// Header sets LimitHeader in h (a dial request's headers, or an accepting handler's
// w.Header() before websocket.Accept) and returns h; a nil h is made.
func Header(h http.Header) http.Header {
	if h == nil {
		h = http.Header{}
	}
	h.Set(LimitHeader, strconv.Itoa(ReadLimit))
	return h
}

// PeerLimit is the largest message the peer whose handshake headers are h reads: its
// LimitHeader, else MaxChunk (a peer that predates the header; nil h too).
func PeerLimit(h http.Header) int {
	n, err := strconv.Atoi(h.Get(LimitHeader))
	if err != nil || n < MaxChunk {
		return MaxChunk
	}
	return n
}

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
	closed atomic.Bool
	once   sync.Once
	local  net.Addr
	remote net.Addr
	chunk  int // the largest message written (New)

	rmu  sync.Mutex
	rd   io.Reader // the rest of the current data message
	reof bool

	wmu  sync.Mutex
	weof bool

	dmu         sync.Mutex
	read, write deadline
}

// deadline is one direction's deadline and whether an operation is blocked in it.
type deadline struct {
	at      time.Time
	timer   *time.Timer
	busy    bool // an operation runs
	expired bool // the deadline cut an operation: the WebSocket is closed
}

// Addr is the address a Conn reports: "tunnel" and a description (e.g. "machine/8000").
type Addr string

func (a Addr) Network() string { return "tunnel" }
func (a Addr) String() string  { return string(a) }

// New wraps ws; name describes the far end (its RemoteAddr), peer is the headers of its side of
// the handshake (the dial request, or the 101 answer; nil: none): messages written are at most
// min(PeerLimit(peer), BigChunk). The WebSocket's read limit is raised to ReadLimit.
func New(ws *websocket.Conn, name string, peer http.Header) *Conn {
	ws.SetReadLimit(ReadLimit)
	return &Conn{ws: ws, local: Addr("local"), remote: Addr(name), chunk: min(PeerLimit(peer), BigChunk)}
}

// WebSocket returns the underlying connection (to close it with a code and reason).
func (c *Conn) WebSocket() *websocket.Conn { return c.ws }

// Read reads data; io.EOF once the peer half-closed or closed normally. A data message is read
// straight into p (no copy of its own).
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if err := c.begin(true); err != nil {
		return 0, err
	}
	defer c.end(true)
	for {
		if c.rd != nil {
			n, err := c.rd.Read(p)
			if errors.Is(err, io.EOF) {
				c.rd = nil
				err = nil
				if n == 0 {
					continue
				}
			} else if err != nil {
				c.rd = nil
				return n, c.mapErr(err, true)
			}
			return n, err
		}
		if c.reof {
			return 0, io.EOF
		}
		typ, r, err := c.ws.Reader(context.Background())
		if err != nil {
			if websocket.CloseStatus(err) == CloseNormal {
				c.reof = true
				return 0, io.EOF
			}
			return 0, c.mapErr(err, true)
		}
		if typ == websocket.MessageText {
			b, _ := io.ReadAll(io.LimitReader(r, 16))
			io.Copy(io.Discard, r)
			if string(b) == EOF {
				c.reof = true
				return 0, io.EOF
			}
			continue // unknown control messages are ignored
		}
		c.rd = r
	}
}

// Write sends p as one or more data messages.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.weof {
		return 0, errors.New("tunnel: write after CloseWrite")
	}
	if err := c.begin(false); err != nil {
		return 0, err
	}
	defer c.end(false)
	n := 0
	for len(p) > 0 {
		k := min(len(p), c.chunk)
		if err := c.ws.Write(context.Background(), websocket.MessageBinary, p[:k]); err != nil {
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
	if err := c.begin(false); err != nil {
		return err
	}
	defer c.end(false)
	if err := c.ws.Write(context.Background(), websocket.MessageText, []byte(EOF)); err != nil {
		return c.mapErr(err, false)
	}
	return nil
}

// Close ends both directions with a normal close.
func (c *Conn) Close() error { return c.CloseWith(CloseNormal, "") }

// CloseWith ends the tunnel with code and reason (at most 123 bytes are sent).
func (c *Conn) CloseWith(code websocket.StatusCode, reason string) error {
	var err error
	c.once.Do(func() {
		if len(reason) > 123 {
			reason = reason[:123]
		}
		c.closed.Store(true)
		// Close waits for the peer's close frame (at most 5 s); a peer that is gone just ends.
		err = c.ws.Close(code, reason)
		c.dmu.Lock()
		for _, d := range []*deadline{&c.read, &c.write} {
			if d.timer != nil {
				d.timer.Stop()
			}
		}
		c.dmu.Unlock()
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
	c.armLocked(&c.read, t)
	return nil
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.armLocked(&c.write, t)
	return nil
}

func (c *Conn) dir(read bool) *deadline {
	if read {
		return &c.read
	}
	return &c.write
}

// armLocked sets d's deadline to t and (re)arms the timer that cuts an operation blocked past
// it.
func (c *Conn) armLocked(d *deadline, t time.Time) {
	d.at = t
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if t.IsZero() || c.closed.Load() {
		return
	}
	if !time.Now().Before(t) {
		if d.busy {
			c.expireLocked(d)
		}
		return
	}
	d.timer = time.AfterFunc(time.Until(t), func() {
		c.dmu.Lock()
		defer c.dmu.Unlock()
		if d.busy && !d.at.IsZero() && !time.Now().Before(d.at) {
			c.expireLocked(d)
		}
	})
}

// expireLocked cuts the operation blocked in d: coder/websocket cannot resume a read or write
// cut short, so the WebSocket is closed (as a cancelled context would).
func (c *Conn) expireLocked(d *deadline) {
	d.expired = true
	go c.ws.CloseNow()
}

// begin starts an operation in one direction: a timeout error if its deadline has passed.
func (c *Conn) begin(read bool) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	d := c.dir(read)
	if d.expired {
		return timeoutErr{}
	}
	if !d.at.IsZero() && !time.Now().Before(d.at) {
		return timeoutErr{}
	}
	d.busy = true
	return nil
}

func (c *Conn) end(read bool) {
	c.dmu.Lock()
	c.dir(read).busy = false
	c.dmu.Unlock()
}

// timeoutErr is what a read or write past its deadline returns.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "tunnel: i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func (c *Conn) mapErr(err error, read bool) error {
	c.dmu.Lock()
	expired := c.dir(read).expired
	c.dmu.Unlock()
	if expired {
		return timeoutErr{}
	}
	if c.closed.Load() {
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

// copyGrowing copies src to dst until src's EOF (nil) or an error, through a buffer of MaxChunk
// that grows to BigChunk once a read fills it: an idle tunnel (a shell's SSH) holds little, a
// bulk copy moves large messages. It uses neither side's ReadFrom nor WriteTo: a TCP
// connection's would copy through a 32 KiB buffer of its own.
func copyGrowing(dst io.Writer, src io.Reader) (int64, error) {
	buf := make([]byte, MaxChunk)
	var written int64
	for {
		n, err := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			written += int64(w)
			if werr != nil {
				return written, werr
			}
			if w != n {
				return written, io.ErrShortWrite
			}
			if n == len(buf) && len(buf) < BigChunk {
				buf = make([]byte, BigChunk)
			}
		}
		if errors.Is(err, io.EOF) {
			return written, nil
		}
		if err != nil {
			return written, err
		}
	}
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
		_, err := copyGrowing(dst, src)
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
