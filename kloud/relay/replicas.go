package relay

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/kloud-dev/kloud/kloud/kloudhttp"
)

// Several kloud replicas behind a load balancer (kloud/mesh.go): klient dials kloud's public URL
// back for an attachment, and the balancer may send it to any replica. The ticket names the
// replica that waits for it (Options.Replica, before ticketSep); a replica that does not know
// the ticket and sees another replica's id proxies the request, WebSocket upgrade and all, to
// that replica's internal URL (Options.Peer), once: a proxied request carries hopHeader, and a
// replica never proxies one again. The bytes then flow klient → balancer → this replica →
// the waiting one, which relays them to the browser as for its own klients.

// hopHeader marks an attachment another replica proxied here.
const hopHeader = "X-Kloud-Attach-Hop"

// proxyAttach proxies an attachment for another live replica's ticket t and reports whether it
// did (false: the ticket is this replica's, unknown or malformed: the caller refuses it).
func (h *Hub) proxyAttach(w http.ResponseWriter, r *http.Request, t string) bool {
	replica, _, ok := strings.Cut(t, ticketSep)
	if !ok || replica == "" || replica == h.o.Replica || h.o.Peer == nil || r.Header.Get(hopHeader) != "" {
		return false
	}
	peer, err := h.o.Peer(r.Context(), replica)
	if err != nil {
		h.log.Info("attachment for another replica's ticket: no such live replica", "replica", replica, "err", err)
		return false
	}
	u, err := url.Parse(peer)
	if err != nil || u.Host == "" {
		kloudhttp.WriteError(w, http.StatusBadGateway, "the replica waiting for this attachment has no usable internal URL")
		return true
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = u.Host
			pr.Out.Header.Set(hopHeader, h.o.Replica)
		},
		Transport: h.peerTr,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			h.log.Info("proxy attachment to its replica", "replica", replica, "err", err)
			kloudhttp.WriteError(w, http.StatusBadGateway, "the replica waiting for this attachment is unreachable")
		},
	}
	rp.ServeHTTP(w, r)
	return true
}
