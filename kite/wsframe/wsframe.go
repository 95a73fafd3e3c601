// Package wsframe adapts coder/websocket to kite: one JSON-RPC object per text frame. It is the
// only part of kite that names WebSocket types; kite's core speaks frame.Stream (as
// sourcegraph/jsonrpc2's websocket subpackage adapts a WebSocket to jsonrpc2.ObjectStream).
//
// Start with Accept (the serving side, used by kite.Kite.ServeHTTP) and Dial (the dialing side,
// used by kite.Kite.Dial); New wraps a connection established some other way.
package wsframe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/kite/frame"
)

// New adapts an established connection, limiting frames read to maxFrame bytes.
func New(c *websocket.Conn, maxFrame int64) frame.Stream {
	c.SetReadLimit(maxFrame)
	return &frames{c: c}
}

type frames struct {
	c   *websocket.Conn
	buf *[]byte // the frame last returned, from frame.Buffers; given back at the next read
}

// ReadFrame reads a frame into a pooled buffer, valid until the next ReadFrame. The previous one
// goes back to the pool before the read waits, so an idle connection holds none.
func (w *frames) ReadFrame(ctx context.Context) ([]byte, error) {
	if w.buf != nil {
		frame.PutBuffer(w.buf)
		w.buf = nil
	}
	typ, r, err := w.c.Reader(ctx)
	if err == nil {
		w.buf = frame.GetBuffer()
		*w.buf, err = readAll(r, (*w.buf)[:0])
	}
	if err != nil {
		if errors.Is(err, websocket.ErrMessageTooBig) {
			return nil, fmt.Errorf("%w: %w", frame.ErrTooLarge, err)
		}
		return nil, err
	}
	if typ != websocket.MessageText {
		return frame.Binary, nil
	}
	return *w.buf, nil
}

// readAll is io.ReadAll appending to b.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				return b, nil
			}
			return b, err
		}
	}
}

func (w *frames) WriteFrame(ctx context.Context, b []byte) error {
	return w.c.Write(ctx, websocket.MessageText, b)
}

func (w *frames) Ping(ctx context.Context) error { return w.c.Ping(ctx) }

func (w *frames) Close(code frame.CloseCode, reason string) error {
	if code < 0 {
		return w.c.CloseNow()
	}
	err := w.c.Close(websocket.StatusCode(code), reason)
	if err != nil {
		w.c.CloseNow()
	}
	return err
}

// AcceptOptions configure Accept.
type AcceptOptions struct {
	// Subprotocol the client must ask for (required); a client that does not is closed with
	// 1008 (policy violation) and Accept returns an error.
	Subprotocol string
	// OriginPatterns are the cross-origin hosts allowed besides the request's own
	// (coder/websocket's AcceptOptions.OriginPatterns).
	OriginPatterns []string
	// MaxFrame bounds a frame read (required).
	MaxFrame int64
}

// Accept upgrades an HTTP request to a WebSocket carrying kite frames. On error the response
// has been written (or the connection closed).
func Accept(w http.ResponseWriter, r *http.Request, o AcceptOptions) (frame.Stream, error) {
	if hj, ok := w.(http.Hijacker); ok {
		w = smallBuffers{w, hj}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols:   []string{o.Subprotocol},
		OriginPatterns: o.OriginPatterns,
	})
	if err != nil {
		return nil, fmt.Errorf("websocket accept: %w", err)
	}
	if ws.Subprotocol() != o.Subprotocol {
		ws.Close(websocket.StatusPolicyViolation, "subprotocol "+o.Subprotocol+" is required")
		return nil, fmt.Errorf("websocket accept: the client did not ask for subprotocol %s", o.Subprotocol)
	}
	return New(ws, o.MaxFrame), nil
}

// NotUpgradedError is Dial's error when an HTTP server answered url but did not switch to a
// WebSocket: something else than a kite listens there (or the path is wrong).
type NotUpgradedError struct {
	URL    string
	Status string // e.g. "404 Not Found"
	// Server and ContentType are the response's headers (may be empty): what answered.
	Server, ContentType string
	Err                 error // the WebSocket library's error
}

func (e *NotUpgradedError) Error() string { return e.Err.Error() }
func (e *NotUpgradedError) Unwrap() error { return e.Err }

// Dial opens a WebSocket to url (ws://, wss://, http:// or https://) speaking subprotocol, with
// frames read limited to maxFrame bytes. hc, if not nil, is the HTTP client of the upgrade
// request (e.g. one trusting kloud's CA); nil: net/http's default. An HTTP answer other than the
// upgrade is a *NotUpgradedError.
func Dial(ctx context.Context, url, subprotocol string, maxFrame int64, hc *http.Client) (frame.Stream, error) {
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{subprotocol}, HTTPClient: hc})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, &NotUpgradedError{URL: url, Status: resp.Status, Server: resp.Header.Get("Server"),
				ContentType: resp.Header.Get("Content-Type"), Err: err}
		}
		return nil, err
	}
	if ws.Subprotocol() != subprotocol {
		ws.CloseNow()
		return nil, fmt.Errorf("server does not speak %s", subprotocol)
	}
	return New(ws, maxFrame), nil
}

// smallBuffers hands coder/websocket smaller bufio buffers than net/http's 4 KiB reader and
// 4 KiB writer, which it would keep for the connection's life: most kite frames are small and
// a bufio.Reader passes reads larger than its buffer straight through.
type smallBuffers struct {
	http.ResponseWriter
	hj http.Hijacker
}

const hijackBufSize = 1 << 10

func (s smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := s.hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Writer.Flush(); err != nil {
		c.Close()
		return nil, nil, err
	}
	br := brw.Reader
	if n := br.Buffered(); n <= hijackBufSize {
		// The bytes net/http read ahead must sit in the new reader's buffer: coder/websocket
		// takes them from there (Peek) before it resets the reader onto the connection.
		b, _ := br.Peek(n)
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(b)), c), hijackBufSize)
		if _, err := br.Peek(n); err != nil {
			c.Close()
			return nil, nil, err
		}
	}
	return c, bufio.NewReadWriter(br, bufio.NewWriterSize(c, hijackBufSize)), nil
}
