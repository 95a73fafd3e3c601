package kloud_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
)

// TestRevocationClosesConnections: logging out, revoking a kite key and unsharing a machine
// close every connection of that identity: its kite connections (and their event streams), its
// web terminals and its port forwards through kloud's relay (SSH tunnels share the port
// forwards' code, relay.serveTunnel). Each is a real connection to a real kloud and klient;
// the time from the revoking call to each close is measured and printed (the target, 1 s, is
// asserted with no slack here: a close that waits for a cache or a heartbeat takes 2 s or more).
func TestRevocationClosesConnections(t *testing.T) {
	t.Parallel()
	e := newTermEnv(t)
	ctx := t.Context()
	const target = time.Second
	// closes waits for each connection's end and reports how long after start it came.
	type conn struct {
		what string
		done func() <-chan struct{}
	}
	closes := func(cause string, start time.Time, conns ...conn) {
		t.Helper()
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-c.done():
					d := time.Since(start)
					t.Logf("%s: %s closed after %v (target %v)", cause, c.what, d.Round(time.Millisecond), target)
				case <-time.After(30 * time.Second):
					t.Errorf("%s: %s still open 30 s later", cause, c.what)
				}
			}()
		}
		wg.Wait()
	}
	kiteConn := func(c *kite.Conn) conn { return conn{"kite connection", c.Done} }
	termConn := func(term *webtermtest.Term) conn {
		return conn{"web terminal", func() <-chan struct{} {
			ch := make(chan struct{})
			go func() {
				for term.Open() {
					time.Sleep(5 * time.Millisecond)
				}
				close(ch)
			}()
			return ch
		}}
	}
	watch := func(c *kite.Conn) conn {
		w, err := api.NewClient(c).EventWatch(ctx, api.EventWatchParams{Topics: []string{"machines"}})
		if err != nil {
			t.Fatalf("event.watch: %v", err)
		}
		ch := make(chan struct{})
		go func() {
			defer close(ch)
			for {
				if _, err := w.Next(ctx); err != nil {
					return
				}
			}
		}()
		return conn{"event stream", func() <-chan struct{} { return ch }}
	}
	bearer := func(cred string) *webtermtest.Term {
		h := http.Header{"Authorization": {"Bearer " + cred}}
		ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.URL, "http")+"/api/machines/"+e.machine.ID+"/terminal", &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			t.Fatalf("terminal: %v (%s)", err, status(resp))
		}
		t.Cleanup(func() { ws.CloseNow() })
		term := webtermtest.NewTerm(ws)
		term.Type(t, "echo rev-$((40+2))\n")
		term.WaitFor(t, "rev-42")
		return term
	}

	// A TCP echo service on the machine (the dummy machine is this host) for port forwards.
	port := echoServer(t)
	forward := func(cred string) conn {
		tc := dialTunnel(t, e.URL, e.machine.ID, port, cred)
		t.Cleanup(func() { tc.Close() })
		if _, err := tc.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(tc, b); err != nil || string(b) != "ping" {
			t.Fatalf("port forward echo: %q %v", b, err)
		}
		ch := make(chan struct{})
		go func() {
			defer close(ch)
			io.Copy(io.Discard, tc)
		}()
		return conn{"port forward", func() <-chan struct{} { return ch }}
	}

	// Logout: the session's kite connection, its event stream, its terminal and port forward.
	session := e.login("alice", "alice-password")
	sc := e.DialAuth(kite.Auth{Type: kite.AuthSession, Key: session})
	conns := []conn{kiteConn(sc), watch(sc), termConn(bearer(session)), forward(session)}
	other := e.Dial("alice") // another credential of alice's stays open
	req, _ := http.NewRequestWithContext(ctx, "POST", e.URL+"/api/logout", nil)
	req.Header.Set("Cookie", kloud.SessionCookie+"="+session)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("logout: %v %s", err, status(resp))
	}
	closes("logout", start, conns...)
	if err := other.Call(ctx, api.MethodUserWhoami, nil, nil); err != nil {
		t.Errorf("another credential of alice's was closed by the logout: %v", err)
	}

	// Key revocation: the key's kite connection, its event stream and its terminal.
	key, id, err := e.Server.Kontrol.CreateKey("alice", "")
	if err != nil {
		t.Fatal(err)
	}
	kc := e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: key})
	conns = []conn{kiteConn(kc), watch(kc), termConn(bearer(key)), forward(key)}
	start = time.Now()
	if err := e.Server.Kontrol.Revoke(context.Background(), id, "test"); err != nil {
		t.Fatal(err)
	}
	closes("key revocation", start, conns...)

	// Unshare: bob's terminal on alice's machine (a terminal share).
	if _, err := e.Client(kloud.Admin).UserAdd(ctx, api.UserAddParams{Username: "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client().MachineShare(ctx, api.ShareParams{MachineID: e.machine.ID, Username: "bob", Grant: "terminal"}); err != nil {
		t.Fatal(err)
	}
	bobKey, _, err := e.Server.Kontrol.CreateKey("bob", "")
	if err != nil {
		t.Fatal(err)
	}
	var bobTerm *webtermtest.Term
	deadline := time.Now().Add(30 * time.Second)
	for { // the share reaches the agent asynchronously
		h := http.Header{"Authorization": {"Bearer " + bobKey}}
		ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.URL, "http")+"/api/machines/"+e.machine.ID+"/terminal", &websocket.DialOptions{HTTPHeader: h})
		if err == nil {
			t.Cleanup(func() { ws.CloseNow() })
			bobTerm = webtermtest.NewTerm(ws)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bob's terminal: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	bobTerm.Type(t, "echo bob-$((40+2))\n")
	bobTerm.WaitFor(t, "bob-42")
	start = time.Now()
	if _, err := e.client().MachineUnshare(ctx, api.ShareParams{MachineID: e.machine.ID, Username: "bob"}); err != nil {
		t.Fatal(err)
	}
	closes("unshare", start, termConn(bobTerm))
}

// echoServer listens on a loopback port (a dummy machine's, which is this host's) and echoes
// what each connection sends, until the test ends; it returns the port.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}
