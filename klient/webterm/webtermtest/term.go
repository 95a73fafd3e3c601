package webtermtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// Wait is how long Term's helpers poll before failing the test (a deadline, not a timing
// assertion).
const Wait = 30 * time.Second

// Term is the browser's end of a terminal WebSocket: it collects the output (binary frames) and
// notices (text frames) in the background, and sends input and resize frames.
type Term struct {
	WS    *websocket.Conn
	mu    sync.Mutex
	out   strings.Builder
	notes []string
	close websocket.CloseError
	err   error
	done  chan struct{}
}

// NewTerm starts reading ws.
func NewTerm(ws *websocket.Conn) *Term {
	ws.SetReadLimit(webterm.MaxFrame)
	c := &Term{WS: ws, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			typ, b, err := ws.Read(context.Background())
			c.mu.Lock()
			if err != nil {
				c.err = err
				errors.As(err, &c.close)
				c.mu.Unlock()
				return
			}
			if typ == websocket.MessageText {
				c.notes = append(c.notes, string(b))
			} else {
				c.out.Write(b)
			}
			c.mu.Unlock()
		}
	}()
	return c
}

// Output is everything received so far.
func (c *Term) Output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// Notices are the text frames received (kloud's {session, mode, created}, {unreachable}), less
// kloud's acknowledgements of input ({"confirmed": n}), which come as often as input does.
func (c *Term) Notices() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range c.notes {
		if !strings.HasPrefix(n, `{"confirmed":`) {
			out = append(out, n)
		}
	}
	return out
}

// WaitFor waits until the output contains s.
func (c *Term) WaitFor(t testing.TB, s string) {
	t.Helper()
	testutil.Eventually(t, Wait, func() bool { return strings.Contains(c.Output(), s) }, "never saw %q in:\n%s", s, tail(c.Output()))
}

func tail(s string) string {
	if len(s) > 3000 {
		return "..." + s[len(s)-3000:]
	}
	return s
}

// Send writes one frame: op and payload.
func (c *Term) Send(t testing.TB, op byte, payload []byte) {
	t.Helper()
	if err := c.WS.Write(context.Background(), websocket.MessageBinary, append([]byte{op}, payload...)); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// Type sends s as input.
func (c *Term) Type(t testing.TB, s string) { t.Helper(); c.Send(t, webterm.OpInput, []byte(s)) }

// Resize sends a resize frame.
func (c *Term) Resize(t testing.TB, cols, rows int) {
	t.Helper()
	c.Send(t, webterm.OpResize, fmt.Appendf(nil, `{"cols":%d,"rows":%d}`, cols, rows))
}

// Closed waits for the server to close the connection and returns its close frame (Code -1 if
// there was none).
func (c *Term) Closed(t testing.TB) websocket.CloseError {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(Wait):
		t.Fatal("terminal connection not closed")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close.Code == 0 {
		return websocket.CloseError{Code: -1, Reason: fmt.Sprint(c.err)}
	}
	return c.close
}

// Open reports whether the connection is still up.
func (c *Term) Open() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}
