package kite_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/frame"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// userAuth accepts keys of the form "user:<name>"; it stands in for kitekey's JWT check so the
// transport can be tested on its own (kitekey has its own auth matrix tests).
var userAuth = kite.AuthenticatorFunc(func(_ context.Context, _ kite.Identity, a kite.Auth) (*kite.Principal, error) {
	name, ok := strings.CutPrefix(a.Key, "user:")
	if !ok || a.Type != kite.AuthKiteKey {
		return nil, fmt.Errorf("bad test key: %w", kite.ErrAuth)
	}
	return &kite.Principal{Username: name, Type: a.Type, KiteID: "id-" + name}, nil
})

type env struct {
	t      *testing.T
	server *kite.Kite
	url    string
	hs     *httptest.Server
}

func newServer(t *testing.T, mod func(*kite.Options)) *env {
	t.Helper()
	opts := kite.Options{Identity: kite.Identity{Name: "server"}, Authenticator: userAuth, Logger: testutil.Logger(t)}
	if mod != nil {
		mod(&opts)
	}
	k, err := kite.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(k)
	t.Cleanup(func() { k.Close(); hs.Close() })
	return &env{t: t, server: k, url: hs.URL + "/kite", hs: hs}
}

func newClientKite(t *testing.T, name string) *kite.Kite {
	t.Helper()
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: name, Username: "claimed-" + name}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func (e *env) dial(name string) (*kite.Kite, *kite.Conn) {
	e.t.Helper()
	k := newClientKite(e.t, name)
	c, err := k.Dial(e.t.Context(), e.url, kite.Auth{Type: kite.AuthKiteKey, Key: "user:" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	return k, c
}

// rawDial opens a WebSocket without the kite client, to speak the wire protocol by hand.
func (e *env) rawDial() *websocket.Conn {
	e.t.Helper()
	ws, _, err := websocket.Dial(e.t.Context(), e.url, &websocket.DialOptions{Subprotocols: []string{kite.Subprotocol}})
	if err != nil {
		e.t.Fatal(err)
	}
	ws.SetReadLimit(64 << 20)
	e.t.Cleanup(func() { ws.CloseNow() })
	return ws
}

func rawCall(t *testing.T, ws *websocket.Conn, frame string) map[string]any {
	t.Helper()
	if err := ws.Write(t.Context(), websocket.MessageText, []byte(frame)); err != nil {
		t.Fatal(err)
	}
	_, b, err := ws.Read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("reply %s: %v", b, err)
	}
	return m
}

func errCode(m map[string]any) float64 {
	e, _ := m["error"].(map[string]any)
	c, _ := e["code"].(float64)
	return c
}

func TestHandshakeRequiredBeforeCalls(t *testing.T) {
	e := newServer(t, nil)
	ws := e.rawDial()
	m := rawCall(t, ws, `{"jsonrpc":"2.0","id":1,"method":"kite.ping"}`)
	if m["result"] != "pong" {
		t.Fatalf("ping before handshake: %v", m)
	}
	for _, method := range []string{"kite.systemInfo", "kite.methods", "no.such"} {
		m = rawCall(t, ws, `{"jsonrpc":"2.0","id":2,"method":"`+method+`"}`)
		if errCode(m) != kite.CodeAuth {
			t.Fatalf("%s before handshake: want -32001, got %v", method, m)
		}
	}
	m = rawCall(t, ws, `{"jsonrpc":"2.0","id":3,"method":"kite.handshake","params":{"kite":{"name":"raw","username":"mallory"},"auth":{"type":"kiteKey","key":"user:alice"}}}`)
	res, _ := m["result"].(map[string]any)
	if res == nil || res["username"] != "alice" {
		t.Fatalf("handshake: %v", m)
	}
	m = rawCall(t, ws, `{"jsonrpc":"2.0","id":4,"method":"kite.methods"}`)
	if _, ok := m["result"].([]any); !ok {
		t.Fatalf("methods after handshake: %v", m)
	}
	m = rawCall(t, ws, `{"jsonrpc":"2.0","id":5,"method":"kite.handshake","params":{"kite":{"name":"raw"},"auth":{"type":"kiteKey","key":"user:bob"}}}`)
	if errCode(m) != kite.CodeState {
		t.Fatalf("second handshake: %v", m)
	}
}

func TestHandshakeRejectsBadCredentials(t *testing.T) {
	e := newServer(t, nil)
	k := newClientKite(t, "c")
	_, err := k.Dial(t.Context(), e.url, kite.Auth{Type: kite.AuthKiteKey, Key: "forged"})
	if !errors.Is(err, kite.ErrAuth) {
		t.Fatalf("want ErrAuth, got %v", err)
	}
	_, err = k.Dial(t.Context(), e.url, kite.Auth{})
	if !errors.Is(err, kite.ErrAuth) {
		t.Fatalf("empty auth: want ErrAuth, got %v", err)
	}
}

func TestUsernameIsTheProvenOne(t *testing.T) {
	e := newServer(t, nil)
	got := make(chan kite.Identity, 1)
	e.server.HandleFunc("who", func(_ context.Context, r *kite.Request) (any, error) {
		got <- r.Peer()
		return r.Username(), nil
	})
	_, c := e.dial("alice")
	var name string
	if err := c.Call(t.Context(), "who", nil, &name); err != nil {
		t.Fatal(err)
	}
	p := <-got
	if name != "alice" || p.Username != "alice" || p.ID != "id-alice" || p.Name != "alice" {
		t.Fatalf("got %q %+v", name, p)
	}
	if c.Peer().Name != "server" {
		t.Fatalf("client sees server as %+v", c.Peer())
	}
}

func TestConcurrentCallsAndOutOfOrderResponses(t *testing.T) {
	e := newServer(t, nil)
	const n = 50
	var arrived sync.WaitGroup
	arrived.Add(n)
	release := make(chan struct{})
	e.server.HandleFunc("barrier", func(ctx context.Context, r *kite.Request) (any, error) {
		var p struct{ I int }
		if err := r.Bind(&p); err != nil {
			return nil, err
		}
		arrived.Done()
		<-release // every call must be in flight at once to pass this point
		return p.I * 2, nil
	})
	// "slow" answers only after "fast" has answered: responses come back out of order.
	fastDone := make(chan struct{})
	e.server.HandleFunc("slow", func(ctx context.Context, r *kite.Request) (any, error) {
		select {
		case <-fastDone:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return "slow", nil
	})
	e.server.HandleFunc("fast", func(context.Context, *kite.Request) (any, error) { return "fast", nil })
	_, c := e.dial("alice")

	go func() { arrived.Wait(); close(release) }()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out int
			if err := c.Call(t.Context(), "barrier", map[string]int{"I": i}, &out); err != nil {
				errs <- err
			} else if out != i*2 {
				errs <- fmt.Errorf("call %d got %d", i, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	slowRes := make(chan string, 1)
	go func() {
		var s string
		if err := c.Call(t.Context(), "slow", nil, &s); err != nil {
			s = err.Error()
		}
		slowRes <- s
	}()
	var f string
	if err := c.Call(t.Context(), "fast", nil, &f); err != nil || f != "fast" {
		t.Fatal(f, err)
	}
	close(fastDone)
	if s := <-slowRes; s != "slow" {
		t.Fatal(s)
	}
}

func TestServerCallsClientAndNotificationsBothWays(t *testing.T) {
	e := newServer(t, nil)
	serverGotNote := make(chan string, 1)
	e.server.HandleNotification("note", func(c *kite.Conn, p []byte) { serverGotNote <- string(p) + " from " + c.Username() })
	e.server.HandleFunc("callback", func(ctx context.Context, r *kite.Request) (any, error) {
		var answer string
		if err := r.Conn.Call(ctx, "client.echo", map[string]string{"s": "hi"}, &answer); err != nil {
			return nil, err
		}
		if err := r.Conn.Notify(ctx, "client.note", map[string]string{"n": "1"}); err != nil {
			return nil, err
		}
		return "client said " + answer, nil
	})
	ck := newClientKite(t, "alice")
	clientGotNote := make(chan string, 1)
	ck.HandleNotification("client.note", func(_ *kite.Conn, p []byte) { clientGotNote <- string(p) })
	ck.HandleFunc("client.echo", func(_ context.Context, r *kite.Request) (any, error) {
		var p struct{ S string }
		if err := r.Bind(&p); err != nil {
			return nil, err
		}
		return p.S + " back, " + r.Username(), nil
	})
	c, err := ck.Dial(t.Context(), e.url, kite.Auth{Type: kite.AuthKiteKey, Key: "user:alice"})
	if err != nil {
		t.Fatal(err)
	}
	var out string
	if err := c.Call(t.Context(), "callback", nil, &out); err != nil {
		t.Fatal(err)
	}
	if out != "client said hi back, kloud" {
		t.Fatalf("got %q", out)
	}
	if n := <-clientGotNote; n != `{"n":"1"}` {
		t.Fatal(n)
	}
	if err := c.Notify(t.Context(), "note", map[string]int{"x": 1}); err != nil {
		t.Fatal(err)
	}
	if n := <-serverGotNote; n != `{"x":1} from alice` {
		t.Fatal(n)
	}
}

func TestMalformedFramesKeepConnectionUsable(t *testing.T) {
	e := newServer(t, nil)
	ws := e.rawDial()
	cases := []struct {
		frame string
		code  float64
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"kite.ping"`, kite.CodeParse},
		{`not json at all`, kite.CodeParse},
		{`[{"jsonrpc":"2.0","id":1,"method":"kite.ping"}]`, kite.CodeInvalidRequest},
		{`{"jsonrpc":"1.0","id":7,"method":"kite.ping"}`, kite.CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":8}`, kite.CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"kite.ping"}`, kite.CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":9,"method":"kite.ping","params":"str"}`, kite.CodeInvalidRequest},
		{`42`, kite.CodeInvalidRequest},
	}
	for _, tc := range cases {
		m := rawCall(t, ws, tc.frame)
		if errCode(m) != tc.code {
			t.Errorf("%s: want %v, got %v", tc.frame, tc.code, m)
		}
	}
	if err := ws.Write(t.Context(), websocket.MessageBinary, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	_, b, err := ws.Read(t.Context())
	if err != nil || !strings.Contains(string(b), "-32600") {
		t.Fatalf("binary frame: %s %v", b, err)
	}
	m := rawCall(t, ws, `{"jsonrpc":"2.0","id":"s1","method":"kite.ping"}`)
	if m["result"] != "pong" || m["id"] != "s1" {
		t.Fatalf("connection not usable after bad frames: %v", m)
	}
}

func TestInvalidParams(t *testing.T) {
	e := newServer(t, nil)
	type P struct {
		Name string `json:"name"`
	}
	e.server.Handle("typed", kite.Typed(func(_ context.Context, _ *kite.Request, p *P) (any, error) { return p.Name, nil }))
	_, c := e.dial("alice")
	err := c.Call(t.Context(), "typed", map[string]any{"nmae": "typo"}, nil)
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "nmae") {
		t.Fatalf("want invalid params naming the field, got %v", err)
	}
	err = c.Call(t.Context(), "missing.method", nil, nil)
	if !errors.Is(err, kite.ErrMethodNotFound) {
		t.Fatalf("got %v", err)
	}
}

func TestOversizeFrameClosesWith1009(t *testing.T) {
	e := newServer(t, func(o *kite.Options) { o.MaxFrameSize = 1 << 20 })
	ws := e.rawDial()
	big := `{"jsonrpc":"2.0","id":1,"method":"kite.ping","params":{"pad":"` + strings.Repeat("x", 1<<20) + `"}}`
	ws.Write(t.Context(), websocket.MessageText, []byte(big))
	_, _, err := ws.Read(t.Context())
	if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		t.Fatalf("want close 1009, got %v", err)
	}
}

func TestOversizeResultBecomesError(t *testing.T) {
	e := newServer(t, func(o *kite.Options) { o.MaxFrameSize = 64 << 10 })
	e.server.HandleFunc("huge", func(context.Context, *kite.Request) (any, error) { return strings.Repeat("y", 100<<10), nil })
	_, c := e.dial("alice")
	err := c.Call(t.Context(), "huge", nil, nil)
	if !errors.Is(err, kite.ErrTooLarge) {
		t.Fatalf("got %v", err)
	}
	var s string
	if err := c.Call(t.Context(), "kite.ping", nil, &s); err != nil || s != "pong" {
		t.Fatal(s, err)
	}
}

func TestCallDeadlineCancelsHandler(t *testing.T) {
	e := newServer(t, nil)
	cancelled := make(chan struct{})
	e.server.HandleFunc("block", func(ctx context.Context, _ *kite.Request) (any, error) {
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	})
	_, c := e.dial("alice")
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err := c.Call(ctx, "block", nil, nil)
	if !errors.Is(err, kite.ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("server handler was not cancelled by kite.cancel")
	}
}

func TestStreams(t *testing.T) {
	e := newServer(t, nil)
	e.server.HandleFunc("count", func(ctx context.Context, r *kite.Request) (any, error) {
		s := r.Conn.NewStream("test.event")
		// Send before the result: the client must still see every event.
		for i := range 3 {
			if err := s.Send(ctx, i); err != nil {
				return nil, err
			}
		}
		go func() {
			for i := 3; i < 10; i++ {
				s.Send(context.Background(), i)
			}
			s.End(context.Background(), fmt.Errorf("done at 10: %w", kite.ErrConflict))
		}()
		return map[string]string{"subscription": s.ID()}, nil
	})
	_, c := e.dial("alice")
	var res struct{ Subscription string }
	if err := c.Call(t.Context(), "count", nil, &res); err != nil {
		t.Fatal(err)
	}
	sub := c.Subscribe(res.Subscription)
	for i := range 10 {
		ev, err := sub.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if ev.Method != "test.event" || string(ev.Data) != fmt.Sprint(i) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	_, err := sub.Next(t.Context())
	if !errors.Is(err, kite.ErrConflict) || !strings.Contains(err.Error(), "done at 10") {
		t.Fatalf("end: %v", err)
	}
}

func TestUnsubscribeStopsServerStream(t *testing.T) {
	e := newServer(t, nil)
	stopped := make(chan struct{})
	e.server.HandleFunc("forever", func(ctx context.Context, r *kite.Request) (any, error) {
		s := r.Conn.NewStream("tick")
		go func() {
			defer close(stopped)
			for s.Send(context.Background(), 1) == nil {
				select {
				case <-s.Done():
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		return s.ID(), nil
	})
	_, c := e.dial("alice")
	var id string
	if err := c.Call(t.Context(), "forever", nil, &id); err != nil {
		t.Fatal(err)
	}
	sub := c.Subscribe(id)
	if _, err := sub.Next(t.Context()); err != nil {
		t.Fatal(err)
	}
	sub.Close()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("stream not stopped after unsubscribe")
	}
}

func TestDeadPeerIsDropped(t *testing.T) {
	gone := make(chan string, 1)
	e := newServer(t, func(o *kite.Options) {
		o.PingInterval, o.PingTimeout = 50*time.Millisecond, 100*time.Millisecond
		o.OnDisconnect = func(c *kite.Conn) { gone <- c.Username() + ": " + c.Err().Error() }
	})
	ws := e.rawDial()
	// Handshake, then never read again: pongs are never sent, as with a stopped process.
	rawCall(t, ws, `{"jsonrpc":"2.0","id":1,"method":"kite.handshake","params":{"kite":{"name":"raw"},"auth":{"type":"kiteKey","key":"user:zombie"}}}`)
	select {
	case msg := <-gone:
		if !strings.HasPrefix(msg, "zombie: peer did not answer ping") {
			t.Fatal(msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("dead peer was not dropped")
	}
}

func TestHandshakeTimeout(t *testing.T) {
	gone := make(chan error, 1)
	e := newServer(t, func(o *kite.Options) {
		o.HandshakeTimeout = 100 * time.Millisecond
		o.OnDisconnect = func(c *kite.Conn) { gone <- c.Err() }
	})
	ws := e.rawDial()
	go ws.Read(context.Background())
	select {
	case err := <-gone:
		if !strings.Contains(err.Error(), "no kite.handshake") {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("idle connection without handshake was kept")
	}
}

func TestRateLimit(t *testing.T) {
	e := newServer(t, nil)
	e.server.HandleFunc("limited", func(context.Context, *kite.Request) (any, error) { return 1, nil }, kite.Throttle(0.001, 2))
	_, c := e.dial("alice")
	var errs []error
	for range 3 {
		errs = append(errs, c.Call(t.Context(), "limited", nil, nil))
	}
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], kite.ErrRateLimited) {
		t.Fatal(errs)
	}
}

func TestHandlerPanicIsInternalError(t *testing.T) {
	e := newServer(t, nil)
	e.server.HandleFunc("boom", func(context.Context, *kite.Request) (any, error) { panic("boom") })
	_, c := e.dial("alice")
	if err := c.Call(t.Context(), "boom", nil, nil); !errors.Is(err, kite.ErrInternal) {
		t.Fatal(err)
	}
	if err := c.Call(t.Context(), "kite.ping", nil, nil); err != nil {
		t.Fatal(err)
	}
}

func TestSubprotocolRequired(t *testing.T) {
	e := newServer(t, nil)
	ws, _, err := websocket.Dial(t.Context(), e.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	_, _, err = ws.Read(t.Context())
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("want policy violation close, got %v", err)
	}
}

func TestClientReconnectsAndRerunsHooks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	start := func(ln net.Listener) (*kite.Kite, *httptest.Server) {
		k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "server"}, Authenticator: userAuth, Logger: testutil.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		var regs atomic.Int32
		k.HandleFunc("register", func(context.Context, *kite.Request) (any, error) { return regs.Add(1), nil })
		hs := httptest.NewUnstartedServer(k)
		hs.Listener = ln
		hs.Start()
		return k, hs
	}
	k1, hs1 := start(ln)

	ck := newClientKite(t, "alice")
	var hooks atomic.Int32
	cl := ck.NewClient(kite.ClientOptions{
		URL: "http://" + addr + "/kite",
		Auth: func(context.Context) (kite.Auth, error) {
			return kite.Auth{Type: kite.AuthKiteKey, Key: "user:alice"}, nil
		},
		OnConnect:  func(ctx context.Context, c *kite.Conn) error { hooks.Add(1); return c.Call(ctx, "register", nil, nil) },
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	})
	cl.Start()
	defer cl.Close()
	if err := cl.Call(t.Context(), "kite.ping", nil, nil); err != nil {
		t.Fatal(err)
	}
	k1.Close()
	hs1.Close()

	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	k2, hs2 := start(ln2)
	defer func() { k2.Close(); hs2.Close() }()
	testutil.Eventually(t, 10*time.Second, func() bool { return hooks.Load() >= 2 && cl.Connects() >= 2 }, "client did not reconnect (hooks=%d)", hooks.Load())
	if err := cl.Call(t.Context(), "kite.ping", nil, nil); err != nil {
		t.Fatal(err)
	}
}

func TestOverPipe(t *testing.T) {
	sk, err := kite.New(kite.Options{Identity: kite.Identity{Name: "server"}, Authenticator: userAuth})
	if err != nil {
		t.Fatal(err)
	}
	defer sk.Close()
	sk.HandleFunc("add", func(_ context.Context, r *kite.Request) (any, error) {
		var p struct{ A, B int }
		if err := r.Bind(&p); err != nil {
			return nil, err
		}
		return p.A + p.B, nil
	})
	ck := newClientKite(t, "alice")
	a, b := net.Pipe()
	sk.ServeFrames(frame.Lines(a, 1<<20), "pipe")
	c, err := ck.DialFrames(t.Context(), frame.Lines(b, 1<<20), "pipe", kite.Auth{Type: kite.AuthKiteKey, Key: "user:alice"})
	if err != nil {
		t.Fatal(err)
	}
	var sum int
	if err := c.Call(t.Context(), "add", map[string]int{"A": 2, "B": 40}, &sum); err != nil || sum != 42 {
		t.Fatal(sum, err)
	}
}

// TestClientCallAcrossDrops: a call made just as the connection drops (from either side) goes
// out on the next connection, and each call runs exactly once.
func TestClientCallAcrossDrops(t *testing.T) {
	sk, err := kite.New(kite.Options{Identity: kite.Identity{Name: "server"}, Authenticator: userAuth, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sk.Close()
	var runs atomic.Int32
	sk.HandleFunc("count", func(context.Context, *kite.Request) (any, error) { return runs.Add(1), nil })
	hs := httptest.NewServer(sk)
	defer hs.Close()
	ck := newClientKite(t, "alice")
	cl := ck.NewClient(kite.ClientOptions{
		URL: hs.URL + "/kite",
		Auth: func(context.Context) (kite.Auth, error) {
			return kite.Auth{Type: kite.AuthKiteKey, Key: "user:alice"}, nil
		},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	})
	cl.Start()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for i := range 20 {
		c, err := cl.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Close(errors.New("dropped by the test")) // the client side: the next call must wait for a new connection
		if err := cl.Call(ctx, "count", nil, nil); err != nil {
			t.Fatalf("call %d after a drop: %v", i, err)
		}
	}
	if n := runs.Load(); n != 20 {
		t.Errorf("handler ran %d times for 20 calls", n)
	}
	if cl.Connects() < 21 {
		t.Errorf("%d connects for 20 drops", cl.Connects())
	}
}
