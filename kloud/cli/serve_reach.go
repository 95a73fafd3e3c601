package cli

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"time"

	"github.com/kloud-dev/kloud/provider"
)

// reachWarnings says, for each provider whose machines could not reach kloud, why and what to
// use instead: kloud listens on listen, and the provider's machines dial the host and port of
// their kloud URL (Provider.KloudURL of the public URL; the public URL itself without it). A
// machine URL on another port than kloud's is left alone (a proxy may forward it); so are
// unavailable providers.
func reachWarnings(ctx context.Context, listen net.Addr, publicURL string, reg *provider.Registry) []string {
	la, ok := listen.(*net.TCPAddr)
	if !ok {
		return nil
	}
	lip, _ := netip.AddrFromSlice(la.IP)
	lip = lip.Unmap()
	var out []string
	for _, name := range reg.Names() {
		p, err := reg.Lookup(name)
		if err != nil || (p.Available != nil && p.Available() != nil) {
			continue
		}
		mURL := publicURL
		if p.KloudURL != nil {
			mURL = p.KloudURL(publicURL)
		}
		host, port, ok := urlHostPort(mURL)
		if !ok || port != fmt.Sprint(la.Port) {
			continue
		}
		ips := resolve(ctx, host)
		if len(ips) == 0 || reachable(lip, ips) {
			continue
		}
		out = append(out, fmt.Sprintf("kloud listens on %s, but the machines of provider %s reach kloud at %s: "+
			"their agents will not be able to download klient or register. Listen on all addresses (--addr :%d) or on theirs (--addr %s)",
			la, name, mURL, la.Port, net.JoinHostPort(host, port)))
	}
	return out
}

// urlHostPort returns the host and port a URL dials (the scheme's default port if it has none).
func urlHostPort(raw string) (host, port string, ok bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return "", "", false
	}
	port = u.Port()
	if port == "" {
		switch u.Scheme {
		case "https", "wss":
			port = "443"
		default:
			port = "80"
		}
	}
	return u.Hostname(), port, true
}

// resolve returns host's addresses (an IP literal as itself); nil if it does not resolve.
func resolve(ctx context.Context, host string) []netip.Addr {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip.Unmap()}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	return ips
}

// reachable reports whether a socket listening on lip accepts connections to one of ips (made
// on this host or through its interfaces): an unspecified address accepts its family (:: both),
// a specific one only itself.
func reachable(lip netip.Addr, ips []netip.Addr) bool {
	for _, ip := range ips {
		switch {
		case !lip.IsValid(), lip == netip.IPv6Unspecified():
			return true
		case lip == netip.IPv4Unspecified() && ip.Is4():
			return true
		case lip == ip:
			return true
		}
	}
	return false
}
