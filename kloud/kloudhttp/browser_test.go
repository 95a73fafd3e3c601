package kloudhttp_test

import (
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/kloud-dev/kloud/kloud/kloudhttp"
)

// TestForwarded: X-Forwarded-For and X-Forwarded-Host are believed only from a trusted proxy;
// the client address is the last hop no trusted proxy added, so what a client writes into the
// header itself (left of its own address) is never taken; a host with a path or userinfo is not.
func TestForwarded(t *testing.T) {
	b := kloudhttp.Browser{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	for _, c := range []struct {
		remote, xff, xfh string
		wantIP, wantHost string
	}{
		{"192.0.2.9:1234", "203.0.113.5", "kloud.example", "192.0.2.9", "example.com"},             // untrusted sender: ignored
		{"10.0.0.2:1234", "203.0.113.5", "kloud.example", "203.0.113.5", "kloud.example"},          // one trusted proxy
		{"10.0.0.2:1234", "198.51.100.1, 203.0.113.5, 10.0.0.3", "", "203.0.113.5", "example.com"}, // spoofed hop left of the client's
		{"10.0.0.2:1234", "nonsense, 203.0.113.5", "", "203.0.113.5", "example.com"},
		{"10.0.0.2:1234", "", "evil.example/path", "10.0.0.2", "example.com"},
		{"10.0.0.2:1234", "10.0.0.7", "", "10.0.0.7", "example.com"}, // only proxies: the first
	} {
		r := httptest.NewRequest("GET", "http://example.com/", nil)
		r.RemoteAddr = c.remote
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if c.xfh != "" {
			r.Header.Set("X-Forwarded-Host", c.xfh)
		}
		got := b.Forwarded(r)
		if ip := kloudhttp.ClientIP(got); ip != c.wantIP || got.Host != c.wantHost {
			t.Errorf("from %s, X-Forwarded-For %q, -Host %q: client %s host %s, want %s %s", c.remote, c.xff, c.xfh, ip, got.Host, c.wantIP, c.wantHost)
		}
	}
	var zero kloudhttp.Browser
	r := httptest.NewRequest("GET", "http://example.com/", nil)
	r.Header.Set("X-Forwarded-For", "203.0.113.5")
	if zero.Forwarded(r) != r {
		t.Error("with no trusted proxy, a request must be served as it came")
	}
}
