package kloud_test

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// wsStatus opens a WebSocket to url with the headers and returns the HTTP status of the answer
// (101 when accepted) and its body's error, if any.
func wsStatus(t *testing.T, url string, h http.Header) int {
	t.Helper()
	ws, resp, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(url, "http"), &websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{kite.Subprotocol}})
	if err == nil {
		ws.CloseNow()
		return http.StatusSwitchingProtocols
	}
	if resp == nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	return resp.StatusCode
}

// TestBrowserOrigins: a browser WebSocket from another origin is refused (the kite, a web
// terminal), one from an allowed origin (kloud serve --allowed-origin) or the public URL's host
// is accepted; behind a proxy that rewrites Host, X-Forwarded-Host is believed only from a
// trusted proxy (--trusted-proxy).
func TestBrowserOrigins(t *testing.T) {
	t.Parallel()
	f := newFlowWith(t, dummy.Options{}, kloudtest.Options{Browser: kloudhttp.Browser{AllowedOrigins: []string{"https://ui.example.test", "*.apps.example.test"}}})
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	kiteURL := f.URL + "/kite"
	for origin, want := range map[string]int{
		"":                             http.StatusSwitchingProtocols, // not a browser
		f.URL:                          http.StatusSwitchingProtocols, // same origin
		"https://ui.example.test":      http.StatusSwitchingProtocols,
		"https://x.apps.example.test":  http.StatusSwitchingProtocols,
		"https://evil.example.test":    http.StatusForbidden,
		"https://ui.example.test.evil": http.StatusForbidden,
		"null":                         http.StatusForbidden,
	} {
		h := http.Header{}
		if origin != "" {
			h.Set("Origin", origin)
		}
		if got := wsStatus(t, kiteURL, h); got != want {
			t.Errorf("kite WebSocket with Origin %q: %d, want %d", origin, got, want)
		}
	}

	// A web terminal of alice's machine (never built: an accepted upgrade then ends, saying so).
	f.credential()
	_, ms := f.stack(f.template(twoVMs))
	key, _, err := f.Server.Kontrol.CreateKey("alice", "")
	if err != nil {
		t.Fatal(err)
	}
	term := f.URL + "/api/machines/" + ms[0].ID + "/terminal"
	if got := wsStatus(t, term, hdr("Authorization", "Bearer "+key, "Origin", "https://evil.example.test")); got != http.StatusForbidden {
		t.Errorf("terminal from another origin: %d, want 403", got)
	}
	if got := wsStatus(t, term, hdr("Authorization", "Bearer "+key, "Origin", "https://ui.example.test")); got == http.StatusForbidden {
		t.Errorf("terminal from an allowed origin: 403")
	}

	// Behind a proxy that rewrites Host to kloud's address: the browser's Origin is the proxy's
	// host, which X-Forwarded-Host names; believed only from a trusted proxy.
	for _, trusted := range []bool{false, true} {
		b := kloudhttp.Browser{}
		if trusted {
			b.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		}
		e := kloudtest.Start(t, kloudtest.Options{Browser: b})
		got := wsStatus(t, e.URL+"/kite", hdr("Origin", "https://kloud.proxy.test", "X-Forwarded-Host", "kloud.proxy.test"))
		want := http.StatusForbidden
		if trusted {
			want = http.StatusSwitchingProtocols
		}
		if got != want {
			t.Errorf("through a proxy (trusted %v): %d, want %d", trusted, got, want)
		}
	}
}

// TestBrowserCookies: the session cookie's attributes are kloud serve's --cookie-secure,
// --cookie-samesite and --cookie-domain (default: HttpOnly, SameSite=Strict, host-only, Secure
// only over https); a bad setting is refused when kloud starts.
func TestBrowserCookies(t *testing.T) {
	t.Parallel()
	login := func(b kloudhttp.Browser) *http.Cookie {
		e := kloudtest.Start(t, kloudtest.Options{Browser: b})
		if _, err := e.Client(kloud.Admin).UserSetPassword(t.Context(), api.SetPasswordParams{Password: "a-long-enough-password"}); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(e.URL+"/api/login", "application/json", strings.NewReader(`{"username":"admin","password":"a-long-enough-password"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("login: %s", resp.Status)
		}
		for _, c := range resp.Cookies() {
			if c.Name == kloudhttp.SessionCookie {
				t.Logf("Set-Cookie (%+v): %s", b, c.String())
				return c
			}
		}
		t.Fatal("login set no session cookie")
		return nil
	}
	c := login(kloudhttp.Browser{})
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.Domain != "" {
		t.Errorf("default session cookie: %s", c.String())
	}
	c = login(kloudhttp.Browser{CookieSecure: "always", CookieSameSite: "lax", CookieDomain: "example.test"})
	if !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || !c.Secure || c.Domain != "example.test" {
		t.Errorf("configured session cookie: %s", c.String())
	}
	for _, bad := range []kloudhttp.Browser{{CookieSameSite: "none"}, {CookieSecure: "maybe"}, {CookieDomain: "a;b"}, {AllowedOrigins: []string{"["}}} {
		if _, err := kloud.New(context.Background(), kloud.Options{DataDir: t.TempDir(), Browser: bad}); err == nil || !strings.Contains(err.Error(), "kloud:") {
			t.Errorf("kloud.New with %+v: %v, want refused", bad, err)
		}
	}
}
