// Package frame is the transport contract under a kite connection: a Stream carries whole
// JSON-RPC frames, and nothing else is asked of a transport. It names no WebSocket type: the
// WebSocket adapter is package kite/wsframe, and Lines carries frames over any byte stream
// (net.Pipe in tests, stdio).
package frame

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Stream carries whole JSON-RPC frames. kite's RPC core (kite.Conn) needs nothing else from a
// transport.
type Stream interface {
	// ReadFrame returns the next frame, valid until the next ReadFrame (streams reuse their
	// buffers: a caller keeps a copy of what it needs). It returns an error wrapping ErrTooLarge
	// (and the stream is closed) if the peer sent more than the configured maximum. One
	// goroutine reads.
	ReadFrame(ctx context.Context) ([]byte, error)
	// WriteFrame sends one frame; safe for concurrent use.
	WriteFrame(ctx context.Context, frame []byte) error
	// Ping checks the peer is alive; streams without a liveness check return nil.
	Ping(ctx context.Context) error
	// Close closes the stream, telling the peer why where the transport can. CloseNow closes
	// at once without a closing handshake.
	Close(code CloseCode, reason string) error
}

// CloseCode says why a stream is closed. The values are WebSocket close codes (RFC 6455
// §7.4.1), which transports without close codes ignore.
type CloseCode int

// Close codes kite uses.
const (
	CloseNormal          CloseCode = 1000
	CloseGoingAway       CloseCode = 1001
	ClosePolicyViolation CloseCode = 1008
	// CloseNow closes without a closing handshake (a peer that stopped answering).
	CloseNow CloseCode = -1
)

// ErrTooLarge is returned (wrapped) by ReadFrame for a frame over the limit.
var ErrTooLarge = errors.New("kite: frame too large")

// Binary is what a Stream returns for a frame that is not text (a WebSocket binary frame): it
// has no meaning on a kite connection, and kite answers it with an error instead of dropping
// the connection.
var Binary = []byte("\x00binary")

// Lines carries newline-delimited frames over any byte stream, frames of at most maxFrame bytes.
func Lines(rwc io.ReadWriteCloser, maxFrame int64) Stream {
	return &lines{rwc: rwc, r: bufio.NewReaderSize(rwc, 64<<10), max: maxFrame}
}

type lines struct {
	rwc io.ReadWriteCloser
	r   *bufio.Reader
	max int64
	wmu sync.Mutex
	buf []byte // reused by ReadFrame
}

func (l *lines) ReadFrame(ctx context.Context) ([]byte, error) {
	buf := l.buf[:0]
	for {
		chunk, err := l.r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if int64(len(buf)) > l.max+1 {
			l.rwc.Close()
			return nil, ErrTooLarge
		}
		if err == nil {
			if cap(buf) <= maxPooled {
				l.buf = buf
			}
			return bytes.TrimRight(buf, "\r\n"), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// maxPooled is the largest buffer kept for reuse: one large frame must not pin its buffer.
const maxPooled = 64 << 10

var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}

// GetBuffer returns an empty buffer from the pool of frame buffers.
func GetBuffer() *[]byte {
	b := buffers.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

// PutBuffer gives a buffer back to the pool (one larger than 64 KiB is dropped).
func PutBuffer(b *[]byte) {
	if cap(*b) <= maxPooled {
		buffers.Put(b)
	}
}

func (l *lines) WriteFrame(ctx context.Context, b []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if d, ok := ctx.Deadline(); ok {
		if c, ok := l.rwc.(net.Conn); ok {
			c.SetWriteDeadline(d)
			defer c.SetWriteDeadline(time.Time{})
		}
	}
	_, err := l.rwc.Write(append(b[:len(b):len(b)], '\n'))
	return err
}

func (l *lines) Ping(context.Context) error { return nil }

func (l *lines) Close(CloseCode, string) error { return l.rwc.Close() }
