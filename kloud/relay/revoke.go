package relay

import (
	"net/http"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kloud-dev/kloud/kloud/kloudhttp"
)

// RevokedReason is the close reason of a terminal, port forward or SSH connection whose
// credential was revoked (logout, kite key revocation).
const RevokedReason = "the credential that opened this connection was revoked (logged out or key revoked)"

// credID is the id (jti) of the credential r authenticated with: its session or kite key, which
// Access.Request verified. "" when it has none.
func credID(r *http.Request) string {
	raw := kloudhttp.RequestSession(r)
	if raw == "" {
		return ""
	}
	var c jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(raw, &c); err != nil {
		return ""
	}
	return c.ID
}

// track registers the closer of a connection r opened (a terminal, a port forward, an SSH
// tunnel) under its credential's id, for CloseCredential; untrack when the connection ends.
func (h *Hub) track(r *http.Request, closer func()) (untrack func()) {
	id := credID(r)
	if id == "" {
		return func() {}
	}
	key := new(int)
	h.mu.Lock()
	if h.byCred == nil {
		h.byCred = map[string]map[*int]func(){}
	}
	if h.byCred[id] == nil {
		h.byCred[id] = map[*int]func(){}
	}
	h.byCred[id][key] = closer
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.byCred[id], key)
		if len(h.byCred[id]) == 0 {
			delete(h.byCred, id)
		}
		h.mu.Unlock()
	}
}

// CloseCredential closes every terminal, port forward and SSH connection opened with the
// credential jti (kloud calls it when a session is logged out or a key revoked) and returns how
// many. The closes run in the background: it does not wait for the peers.
func (h *Hub) CloseCredential(jti string) int {
	h.mu.Lock()
	closers := make([]func(), 0, len(h.byCred[jti]))
	for _, c := range h.byCred[jti] {
		closers = append(closers, c)
	}
	h.mu.Unlock()
	for _, c := range closers {
		go c()
	}
	return len(closers)
}
