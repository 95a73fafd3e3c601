package tunnel_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/tunnel"
)

// pair returns the two ends of a tunnel over a real WebSocket on loopback.
func pair(t *testing.T) (client, server *tunnel.Conn) {
	t.Helper()
	got := make(chan *websocket.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		got <- ws
	}))
	t.Cleanup(srv.Close)
	ws, _, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, s := tunnel.New(ws, "server", nil), tunnel.New(<-got, "client", nil)
	t.Cleanup(func() { c.WebSocket().CloseNow(); s.WebSocket().CloseNow() })
	return c, s
}

// TestPipeHalfClose pipes a TCP connection through a tunnel to an echo-after-EOF server: the
// client's half-close reaches the far TCP end, whose whole answer (bigger than a frame) comes
// back, then both ends see EOF.
func TestPipeHalfClose(t *testing.T) {
	// The far service reads everything, then answers with it reversed in order of chunks.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c) // until the client's half-close arrives
		c.Write(append([]byte("got:"), b...))
	}()
	near, far := pair(t)
	svc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tunnel.Pipe(far, svc) }()

	msg := make([]byte, 3*tunnel.MaxChunk+17)
	rand.Read(msg)
	if _, err := near.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := near.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := near.Write([]byte("x")); err == nil {
		t.Fatal("write after CloseWrite succeeded")
	}
	back, err := io.ReadAll(near)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, append([]byte("got:"), msg...)) {
		t.Fatalf("got %d bytes back, want %d", len(back), len(msg)+4)
	}
	go near.Close() // both ends close; the close handshake completes
	if err := <-done; err != nil {
		t.Fatalf("pipe: %v", err)
	}
}

// TestCloseWithReason: a refusal's code and reason reach the other end.
func TestCloseWithReason(t *testing.T) {
	near, far := pair(t)
	go far.CloseWith(tunnel.CloseRefused, "nothing listens on port 1")
	_, err := near.Read(make([]byte, 1))
	if websocket.CloseStatus(err) != tunnel.CloseRefused || !strings.Contains(err.Error(), "nothing listens") {
		t.Fatalf("read after refusal: %v", err)
	}
}

// TestPipePassesReason: a relay (Pipe of two tunnels) passes a refusal's code and reason from
// one end to the other (klient closing a revoked user's SSH tunnel: the client is told why).
func TestPipePassesReason(t *testing.T) {
	client, relayNear := pair(t)
	relayFar, agent := pair(t)
	done := make(chan error, 1)
	go func() { done <- tunnel.Pipe(relayNear, relayFar) }()
	if _, err := client.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(agent, buf); err != nil {
		t.Fatal(err)
	}
	go agent.CloseWith(tunnel.CloseRefused, "this machine's share with you changed")
	_, err := client.Read(make([]byte, 1))
	if websocket.CloseStatus(err) != tunnel.CloseRefused || !strings.Contains(err.Error(), "share with you changed") {
		t.Fatalf("the client's read after the agent's refusal: %v", err)
	}
	<-done
}

// pairHeaders is pair with the read-limit handshake as kloud and klient make it: each side
// says what it reads (tunnel.Header), and sizes its messages to what the other said. old makes
// the dialing side a build before the header (no header sent, none read).
func pairHeaders(t *testing.T, old bool) (client, server *tunnel.Conn) {
	t.Helper()
	acc := make(chan *tunnel.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tunnel.Header(w.Header())
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		s := tunnel.New(ws, "client", r.Header)
		acc <- s
	}))
	t.Cleanup(srv.Close)
	var h http.Header
	if !old {
		h = tunnel.Header(nil)
	}
	ws, resp, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(srv.URL, "http"), &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	peer := resp.Header
	if old {
		peer = nil // the old build did not read the header
	}
	c := tunnel.New(ws, "server", peer)
	if old {
		ws.SetReadLimit(tunnel.MaxFrame) // what the old build read
	}
	s := <-acc
	t.Cleanup(func() { c.WebSocket().CloseNow(); s.WebSocket().CloseNow() })
	return c, s
}

// TestMessageSizes: peers that both say what they read exchange BigChunk messages; a peer that
// said nothing (an older klient or CLI) gets MaxChunk ones, which it reads.
func TestMessageSizes(t *testing.T) {
	sizes := func(t *testing.T, from, to *tunnel.Conn) []int {
		t.Helper()
		msg := make([]byte, 3*tunnel.BigChunk)
		go func() { from.Write(msg); from.CloseWrite() }()
		var out []int
		for {
			typ, b, err := to.WebSocket().Read(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if typ == websocket.MessageText {
				return out
			}
			out = append(out, len(b))
		}
	}
	t.Run("both new", func(t *testing.T) {
		c, s := pairHeaders(t, false)
		if got := sizes(t, c, s); len(got) != 3 || got[0] != tunnel.BigChunk {
			t.Errorf("client to server: messages %v, want 3 of %d", got, tunnel.BigChunk)
		}
		if got := sizes(t, s, c); len(got) != 3 || got[0] != tunnel.BigChunk {
			t.Errorf("server to client: messages %v, want 3 of %d", got, tunnel.BigChunk)
		}
	})
	t.Run("old client", func(t *testing.T) {
		c, s := pairHeaders(t, true)
		got := sizes(t, s, c)
		if len(got) != 3*tunnel.BigChunk/tunnel.MaxChunk || got[0] != tunnel.MaxChunk {
			t.Errorf("server to an old client: %d messages of %v, want %d of %d", len(got), got[:1], 3*tunnel.BigChunk/tunnel.MaxChunk, tunnel.MaxChunk)
		}
	})
}

// TestDeadlines: a deadline already past fails a read at once and leaves the tunnel usable; one
// that passes while a read blocks cuts it with a timeout error.
func TestDeadlines(t *testing.T) {
	c, s := pair(t)
	c.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("read past its deadline: %v, want a timeout", err)
	}
	c.SetReadDeadline(time.Time{})
	go s.Write([]byte("x"))
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
		t.Fatalf("read after the deadline was lifted: %q %v", b, err)
	}
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	start := time.Now()
	if _, err := c.Read(b); !isTimeout(err) {
		t.Fatalf("a read blocked past its deadline: %v, want a timeout", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the blocked read ended %s after its deadline", d)
	}
	if _, err := c.Read(b); err == nil {
		t.Fatal("a read after a cut one succeeded")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
