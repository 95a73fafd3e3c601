package provider

import (
	"net/http"
	"strings"
)

// HandlerPrefix is where kloud mounts a provider's HTTP service (Provider.Handler) on its own
// HTTP server: "/provider/<name>/". The handler sees the full request path, prefix included.
//
// A provider serves there what its Terraform provider needs from kloud's process (the local
// provider: creating and destroying machines, which needs root, for an unprivileged terraform).
// Such a service authenticates every request itself; kloud adds nothing but the route.
func HandlerPrefix(name string) string { return "/provider/" + name + "/" }

// MountHandlers calls mount(pattern, handler) for every provider of r that has a Handler, with
// pattern HandlerPrefix(name).
func (r *Registry) MountHandlers(mount func(pattern string, h http.Handler)) {
	for _, n := range r.Names() {
		p, err := r.Lookup(n)
		if err != nil || p.Handler == nil || strings.ContainsAny(n, "/ {}") {
			continue
		}
		mount(HandlerPrefix(n), p.Handler)
	}
}
