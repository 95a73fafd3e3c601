package kloudhttp

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"
)

// Browser is how kloud's HTTP routes treat browsers and the proxies in front of kloud (kloud
// serve --allowed-origin, --cookie-secure, --cookie-samesite, --cookie-domain, --trusted-proxy;
// docs/admin-guide.md, "Behind a proxy"). The zero value is kloud alone on its address: only
// same-origin WebSockets, SameSite=Strict host-only session cookies, Secure when kloud is
// reached over https, and no forwarded header believed.
type Browser struct {
	// AllowedOrigins are the browser origins that may open kloud's WebSockets (the kite, web
	// terminals, port forwards) besides the request's own host and the public URL's: an origin
	// ("https://ui.example.com") or a host pattern ("*.example.com", path.Match). Default none.
	AllowedOrigins []string
	// CookieSecure: "auto" (default: Secure when the request came over TLS or the public URL is
	// https), "always" or "never".
	CookieSecure string
	// CookieSameSite of the session cookie: "strict" (default) or "lax". (The single sign-on
	// cookies are always Lax: the provider's redirect back is a cross-site navigation.)
	CookieSameSite string
	// CookieDomain of the session cookie, e.g. "example.com" to share it with sibling hosts.
	// Default none: the cookie is the host's only.
	CookieDomain string
	// TrustedProxies are the addresses of the proxies in front of kloud: a request from one of
	// them has its client address taken from X-Forwarded-For (the last address no trusted proxy
	// added) and its host from X-Forwarded-Host. From any other address both headers are
	// ignored. Default none.
	TrustedProxies []netip.Prefix
}

// Validate checks the settings (kloud.New calls it).
func (b Browser) Validate() error {
	switch b.CookieSecure {
	case "", "auto", "always", "never":
	default:
		return fmt.Errorf("cookie secure %q: want auto, always or never", b.CookieSecure)
	}
	switch strings.ToLower(b.CookieSameSite) {
	case "", "strict", "lax":
	default:
		return fmt.Errorf("cookie samesite %q: want strict or lax (none would send the session with cross-site requests)", b.CookieSameSite)
	}
	if strings.ContainsAny(b.CookieDomain, " ;,/:") {
		return fmt.Errorf("cookie domain %q: want a domain name", b.CookieDomain)
	}
	for _, o := range b.AllowedOrigins {
		if _, err := path.Match(originHost(o), ""); err != nil || originHost(o) == "" {
			return fmt.Errorf("allowed origin %q: want https://host[:port] or a host pattern such as *.example.com", o)
		}
	}
	return nil
}

// originHost is an allowed origin's host[:port] (pattern), lower case.
func originHost(o string) string {
	if strings.Contains(o, "://") {
		u, err := url.Parse(o)
		if err != nil {
			return ""
		}
		return strings.ToLower(u.Host)
	}
	return strings.ToLower(o)
}

// OriginPatterns are the hosts a WebSocket's Origin may name besides the request's own (the
// kite's coder/websocket AcceptOptions.OriginPatterns): the public URL's and AllowedOrigins.
func (b Browser) OriginPatterns(publicURL string) []string {
	var out []string
	if u, err := url.Parse(publicURL); err == nil && u.Host != "" {
		out = append(out, strings.ToLower(u.Host))
	}
	for _, o := range b.AllowedOrigins {
		out = append(out, originHost(o))
	}
	return out
}

// OriginAllowed accepts requests without an Origin (not a browser), browsers on the request's
// own host, and the origins OriginPatterns names.
func (b Browser) OriginAllowed(r *http.Request, publicURL string) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false
	}
	host := strings.ToLower(u.Host)
	if strings.EqualFold(host, r.Host) {
		return true
	}
	for _, p := range b.OriginPatterns(publicURL) {
		if ok, _ := path.Match(p, host); ok {
			return true
		}
	}
	return false
}

// Secure says whether cookies set in answer to r are Secure.
func (b Browser) Secure(r *http.Request, publicURL string) bool {
	switch b.CookieSecure {
	case "always":
		return true
	case "never":
		return false
	}
	return r.TLS != nil || strings.HasPrefix(publicURL, "https://")
}

// SameSite is the session cookie's SameSite.
func (b Browser) SameSite() http.SameSite {
	if strings.EqualFold(b.CookieSameSite, "lax") {
		return http.SameSiteLaxMode
	}
	return http.SameSiteStrictMode
}

// Forwarded returns r with the client address and host the trusted proxies forwarded (r as it
// is when it did not come from one).
func (b Browser) Forwarded(r *http.Request) *http.Request {
	if len(b.TrustedProxies) == 0 || !b.trusted(ClientIP(r)) {
		return r
	}
	fwdFor, fwdHost := r.Header.Values("X-Forwarded-For"), r.Header.Get("X-Forwarded-Host")
	if len(fwdFor) == 0 && fwdHost == "" {
		return r
	}
	r2 := r.Clone(r.Context())
	var hops []string
	for _, v := range fwdFor {
		for _, h := range strings.Split(v, ",") {
			hops = append(hops, strings.TrimSpace(h))
		}
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(hops[i])
		if err != nil {
			break // not an address: believe nothing further left
		}
		r2.RemoteAddr = net.JoinHostPort(a.String(), "0")
		if !b.trusted(a.String()) {
			break
		}
	}
	if h := strings.TrimSpace(strings.Split(fwdHost, ",")[0]); h != "" && !strings.ContainsAny(h, "/ @") {
		r2.Host = h
	}
	return r2
}

func (b Browser) trusted(ip string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range b.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
