package kloud_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/model"
)

// appServer is the web server "in the machine": the dummy provider's machines are klient
// processes on this host, so the machine's loopback is this host's.
type appServer struct {
	port    int
	mu      sync.Mutex
	cookies []string // the Cookie headers it received
}

func startAppServer(t *testing.T) *appServer {
	t.Helper()
	a := &appServer{}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.cookies = append(a.cookies, r.Header.Get("Cookie"))
		a.mu.Unlock()
		http.SetCookie(w, &http.Cookie{Name: "app_own", Value: "yes", Path: "/"})
		fmt.Fprintf(w, "hello from the machine, host %s", r.Host)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			typ, b, err := ws.Read(r.Context())
			if err != nil {
				return
			}
			if err := ws.Write(r.Context(), typ, append([]byte("echo:"), b...)); err != nil {
				return
			}
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	a.port = ln.Addr().(*net.TCPAddr).Port
	return a
}

func (a *appServer) sawCookies() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.cookies...)
}

// browser is an HTTP client with a cookie jar that reaches every host (the app hosts
// *.localhost) at kloud's listener, as a browser resolving *.localhost to loopback does.
type browser struct {
	*http.Client
	jar *cookiejar.Jar
}

func newBrowser(t *testing.T, kloudURL string) *browser {
	t.Helper()
	u, _ := url.Parse(kloudURL)
	jar, _ := cookiejar.New(nil)
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, u.Host)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &browser{Client: &http.Client{Jar: jar, Transport: tr}, jar: jar}
}

func (b *browser) get(t *testing.T, u string) (*http.Response, string) {
	t.Helper()
	resp, err := b.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// TestPortForwardApps: a web server in a machine is reachable in the browser through kloud on
// its own origin by its owner and a terminal share, not by a read-only share nor anyone else;
// the app never sees kloud's cookies; WebSocket upgrades work; `port-forward`'s TCP tunnel
// carries raw bytes with half-close.
func TestPortForwardApps(t *testing.T) {
	t.Parallel()
	e := newTermEnv(t)
	app := startAppServer(t)
	addUsers(t, e.Env, true, "bob", "carol")
	aliceCookie := e.login("alice", "alice-password")
	bobCookie, carolCookie := e.login("bob", "bob-password"), e.login("carol", "carol-password")
	id, port := e.machine.ID, app.port
	appURL := kloud.AppURL(e.Server, id, port)
	if want := fmt.Sprintf("p%d--m%s.localhost", port, id); !strings.Contains(appURL, want) {
		t.Fatalf("app url %s, want host %s", appURL, want)
	}
	openURL := fmt.Sprintf("%s/api/machines/%s/ports/%d/open?path=%s", e.URL, id, port, url.QueryEscape("/hello?x=1"))
	withSession := func(b *browser, cookie string) {
		u, _ := url.Parse(e.URL)
		b.jar.SetCookies(u, []*http.Cookie{{Name: kloud.SessionCookie, Value: cookie}})
	}

	// The owner: kloud's origin → the app's origin with a ticket → the app, with its own cookie.
	alice := newBrowser(t, e.URL)
	withSession(alice, aliceCookie)
	resp, body := alice.get(t, openURL)
	if resp.StatusCode != 200 || !strings.Contains(body, "hello from the machine") || resp.Request.URL.Host != strings.TrimSuffix(strings.TrimPrefix(appURL, "http://"), "/") {
		t.Fatalf("owner: %s at %s: %q", resp.Status, resp.Request.URL, body)
	}
	for _, c := range app.sawCookies() {
		if strings.Contains(c, kloud.SessionCookie) || strings.Contains(c, "kloud_app") {
			t.Fatalf("the app saw kloud's cookie: %q", c)
		}
	}
	// Its cookie and the app's own stay on the app's host; the UI's origin gets neither.
	ui, _ := url.Parse(e.URL)
	for _, c := range alice.jar.Cookies(ui) {
		if c.Name != kloud.SessionCookie {
			t.Fatalf("cookie %s leaked to kloud's origin", c.Name)
		}
	}
	// Again, now with the app's cookie (no round trip through kloud's origin), and its own cookie sent.
	resp, body = alice.get(t, appURL+"hello")
	if resp.StatusCode != 200 || resp.Request.URL.Path != "/hello" || !strings.Contains(body, "hello") {
		t.Fatalf("owner again: %s %s %q", resp.Status, resp.Request.URL, body)
	}
	if c := app.sawCookies(); c[len(c)-1] != "app_own=yes" {
		t.Fatalf("app cookies: %q", c)
	}

	// A WebSocket through the app's host.
	appU, _ := url.Parse(appURL)
	var hdr http.Header = http.Header{"Cookie": {cookieHeader(alice.jar.Cookies(appU))}}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, strings.Replace(appURL, "http://", "ws://", 1)+"echo", &websocket.DialOptions{HTTPClient: alice.Client, HTTPHeader: hdr})
	if err != nil {
		t.Fatalf("websocket through the app host: %v", err)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, b, err := ws.Read(ctx); err != nil || string(b) != "echo:ping" {
		t.Fatalf("websocket echo: %q %v", b, err)
	}
	ws.Close(websocket.StatusNormalClosure, "")

	// Nobody's browser: the app redirects to kloud's origin, which asks to log in.
	anon := newBrowser(t, e.URL)
	resp, body = anon.get(t, appURL+"hello")
	if resp.StatusCode != http.StatusUnauthorized || resp.Request.URL.Host != ui.Host || strings.Contains(body, "hello from") {
		t.Fatalf("anonymous: %s at %s: %q", resp.Status, resp.Request.URL, body)
	}
	// alice's app cookie is for that host only: another port's host refuses it.
	other := strings.Replace(appURL, fmt.Sprintf("p%d--", port), "p1--", 1)
	req, _ := http.NewRequest("GET", other+"hello", nil)
	req.Header.Set("Cookie", cookieHeader(alice.jar.Cookies(appU)))
	if resp, err := anon.Transport.RoundTrip(req); err != nil || resp.StatusCode != http.StatusTemporaryRedirect {
		t.Fatalf("app cookie on another host: %v %s", err, status(resp))
	}

	// carol (not shared) and bob (read-only) are refused at kloud's origin; a terminal share works.
	for _, c := range []struct {
		who, cookie string
		want        int
	}{{"carol", carolCookie, http.StatusNotFound}, {"bob read-only", bobCookie, http.StatusForbidden}} {
		if c.who == "bob read-only" {
			share(t, e, "bob", model.GrantReadonly)
		}
		b := newBrowser(t, e.URL)
		withSession(b, c.cookie)
		if resp, body := b.get(t, openURL); resp.StatusCode != c.want || strings.Contains(body, "hello from") {
			t.Fatalf("%s: %s %q", c.who, resp.Status, body)
		}
	}
	share(t, e, "bob", model.GrantTerminal)
	bob := newBrowser(t, e.URL)
	withSession(bob, bobCookie)
	if resp, body := bob.get(t, openURL); resp.StatusCode != 200 || !strings.Contains(body, "hello from") {
		t.Fatalf("bob with a terminal share: %s %q", resp.Status, body)
	}
	// Unshared: bob's app cookie stops working at once.
	if _, err := api.NewClient(e.alice).MachineUnshare(t.Context(), api.ShareParams{MachineID: id, Username: "bob"}); err != nil {
		t.Fatal(err)
	}
	if resp, body := bob.get(t, appURL+"hello"); resp.StatusCode != http.StatusForbidden || strings.Contains(body, "hello from") {
		t.Fatalf("bob after unshare: %s %q", resp.Status, body)
	}

	// The TCP tunnel of `kloud port-forward`: raw bytes, half-close, then the reply.
	tun := dialTunnel(t, e.URL, id, port, aliceCookie)
	fmt.Fprintf(tun, "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if err := tun.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(bufio.NewReader(tun))
	if err != nil || !strings.HasPrefix(string(all), "HTTP/1.1 200") || !strings.Contains(string(all), "hello from the machine") {
		t.Fatalf("tcp tunnel: %v %q", err, all)
	}
	tun.Close()
	// A port nothing listens on: refused before the upgrade, saying why.
	free := freePort(t)
	_, resp, err = websocket.Dial(t.Context(), fmt.Sprintf("ws%s/api/machines/%s/ports/%d/tcp", strings.TrimPrefix(e.URL, "http"), id, free),
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + aliceCookie}}})
	if err == nil || resp == nil || !strings.Contains(status(resp), "nothing listens on port") {
		t.Fatalf("closed port: %v %s", err, status(resp))
	}
	// `kloud port-forward` itself: a local port whose connections reach the machine's.
	keyFile := filepath.Join(t.TempDir(), "alice.session")
	os.WriteFile(keyFile, []byte(aliceCookie), 0o600)
	pr, pw := io.Pipe()
	fctx, stop := context.WithCancel(t.Context())
	exited := make(chan int, 1)
	go func() {
		exited <- cli.Run(fctx, []string{"port-forward", "--url", e.URL, "--key", keyFile, e.machine.Label, "0:" + fmt.Sprint(port)}, pw, pw)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	local, _, ok := strings.Cut(strings.TrimPrefix(line, "Forwarding "), " -> ")
	if err != nil || !ok {
		t.Fatalf("port-forward said %q (%v)", line, err)
	}
	for range 3 { // each connection is its own tunnel
		resp, err := http.Get("http://" + local + "/hello")
		if err != nil {
			t.Fatalf("through port-forward: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "hello from the machine") {
			t.Fatalf("through port-forward: %s %q", resp.Status, b)
		}
	}
	stop()
	if code := <-exited; code != 0 {
		t.Fatalf("port-forward exited %d", code)
	}

	// carol cannot tunnel to alice's machine.
	_, resp, err = websocket.Dial(t.Context(), fmt.Sprintf("ws%s/api/machines/%s/ports/%d/tcp", strings.TrimPrefix(e.URL, "http"), id, port),
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + carolCookie}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("carol's tunnel: %v %s", err, status(resp))
	}
}

func share(t *testing.T, e *termEnv, user, grant string) {
	t.Helper()
	if _, err := api.NewClient(e.alice).MachineShare(t.Context(), api.ShareParams{MachineID: e.machine.ID, Username: user, Grant: grant}); err != nil {
		t.Fatal(err)
	}
}

func dialTunnel(t *testing.T, kloudURL, id string, port int, cred string) *tunnel.Conn {
	t.Helper()
	ws, resp, err := websocket.Dial(t.Context(), fmt.Sprintf("ws%s/api/machines/%s/ports/%d/tcp", strings.TrimPrefix(kloudURL, "http"), id, port),
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + cred}}})
	if err != nil {
		t.Fatalf("tunnel: %v %s", err, status(resp))
	}
	return tunnel.New(ws, "test", nil)
}

func cookieHeader(cs []*http.Cookie) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, c.Name+"="+c.Value)
	}
	return strings.Join(parts, "; ")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
