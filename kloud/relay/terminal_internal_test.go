package relay

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/klient/klientapi"
)

// cutProxy forwards TCP connections to target until cut: from then on it carries nothing either
// way and closes nothing, as a machine whose link went down (no FIN, no RST).
type cutProxy struct {
	ln       net.Listener
	cut      chan struct{}
	cutOnce  sync.Once
	done     chan struct{}
	doneOnce sync.Once
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, cut: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { p.doneOnce.Do(func() { close(p.done) }); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go p.pipe(c, u)
			go p.pipe(u, c)
		}
	}()
	return p
}

func (p *cutProxy) pipe(dst, src net.Conn) {
	defer func() { <-p.done; dst.Close(); src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-p.cut:
			return // dropped, and nothing more: the link is down
		default:
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *cutProxy) Cut() { p.cutOnce.Do(func() { close(p.cut) }) }

// TestRelayNoticesACutKlient relays a browser's WebSocket to a klient-side one through a link
// that is then cut: the relay confirms input klient received ({"confirmed": n}, a ping sent
// right after the input, not at the next tick), and once the
// link carries nothing the browser gets 4004 "the machine is unreachable" (from the relay's
// pings of klient's side) with the input typed after the cut never confirmed, so the page sends
// it again on its next attachment.
func TestRelayNoticesACutKlient(t *testing.T) {
	t.Parallel()
	// klient's side: takes input frames and says what it got, on a channel.
	got := make(chan string, 16)
	klientSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			_, b, err := ws.Read(r.Context())
			if err != nil {
				return
			}
			if len(b) > 0 && b[0] == 0 {
				got <- string(b[1:])
			}
		}
	}))
	t.Cleanup(klientSrv.Close)
	proxy := newCutProxy(t, strings.TrimPrefix(klientSrv.URL, "http://"))

	h := &Hub{relays: map[*termRelay]struct{}{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	relayed := make(chan *termRelay, 1)
	kloudSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		browser, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		klient, _, err := websocket.Dial(r.Context(), "ws://"+proxy.ln.Addr().String(), nil)
		if err != nil {
			browser.Close(klientapi.CloseRefused, err.Error())
			return
		}
		rl := h.start(browser, klient, "m1")
		// No ticks: input alone must make the relay ping klient (and so confirm it, and find
		// the cut link).
		rl.pingEvery, rl.pingWait = time.Hour, 500*time.Millisecond
		relayed <- rl
		rl.run()
	}))
	t.Cleanup(kloudSrv.Close)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(kloudSrv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	<-relayed
	input := func(s string) {
		t.Helper()
		if err := ws.Write(ctx, websocket.MessageBinary, append([]byte{0}, s...)); err != nil {
			t.Fatal(err)
		}
	}
	// Reads text notices until one confirms at least n input bytes (n < 0: until the close).
	readUntil := func(n int64) (confirmed int64, err error) {
		for {
			typ, b, err := ws.Read(ctx)
			if err != nil {
				return confirmed, err
			}
			if typ != websocket.MessageText {
				continue
			}
			var nt terminalNotice
			if err := json.Unmarshal(b, &nt); err != nil {
				t.Fatalf("notice %q: %v", b, err)
			}
			confirmed = max(confirmed, nt.Confirmed)
			if n >= 0 && confirmed >= n {
				return confirmed, nil
			}
		}
	}

	input("abc")
	if s := <-got; s != "abc" {
		t.Fatalf("klient got %q", s)
	}
	if _, err := readUntil(3); err != nil {
		t.Fatalf("no {confirmed: 3} for the input klient got: %v", err)
	}

	proxy.Cut()
	input("typed during the cut")
	confirmed, err := readUntil(-1)
	if code := websocket.CloseStatus(err); code != klientapi.CloseAgentGone || !strings.Contains(err.Error(), "the machine is unreachable") {
		t.Fatalf("after the cut the browser's connection ended with %v (code %d), want 4004 the machine is unreachable", err, code)
	}
	if confirmed > 3 {
		t.Errorf("input sent after the cut was confirmed (%d bytes in all): the page would not send it again", confirmed)
	}
	select {
	case s := <-got:
		t.Errorf("klient got %q across a cut link", s)
	default:
	}
}
