package tunnel_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
	c, s := tunnel.New(ws, "server"), tunnel.New(<-got, "client")
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
