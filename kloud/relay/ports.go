package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/model"
)

// Port forwarding through kloud (docs/protocol.md "Port forwarding"). A TCP port of a machine
// is reached over the machine's agent connection, never by a route from the user to the
// machine: kloud calls port.connect on the machine's klient with a one-time ticket, klient
// dials the port on the machine's loopback and kloud's attach endpoint (the terminal's), and
// kloud has a tunnel (package internal/tunnel) to that port. Two users of it:
//
//	GET /api/machines/{id}/ports/{port}/tcp     WebSocket: a tunnel for `kloud port-forward`
//	GET /api/machines/{id}/ports/{port}/open    the browser: a machine's web app (apps.go)
//
// Who may forward: the machine's owner and users it is shared with with a terminal or full
// grant (klient checks the user's token against its own access list too); a read-only share
// may not. Admins get nothing by being admins.

// mayForward says whether user may forward ports of m: its owner, a terminal or a full share.
func mayForward(user string, m *model.Machine) error {
	switch Role(user, m) {
	case "owner", model.GrantTerminal, model.GrantFull:
		return nil
	case model.GrantReadonly:
		return fmt.Errorf("machine %s is shared with %s read-only: forwarding its ports needs a terminal or full share: %w", m.Label, user, kite.ErrPermission)
	}
	return fmt.Errorf("machine %s is not shared with %s: only its owner and users it is shared with (terminal or full) reach its ports: %w", m.Label, user, kite.ErrPermission)
}

// pathPort is the request's {port}.
func pathPort(r *http.Request) (int, error) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err == nil {
		err = klientapi.CheckPort(port)
	}
	if err != nil {
		return 0, &statusError{http.StatusBadRequest, fmt.Sprintf("port %q: want 1-65535", r.PathValue("port"))}
	}
	return port, nil
}

// portTarget names a machine's port in the audit log: "machine/<id>:<port>".
func portTarget(r *http.Request, port int) string {
	return "machine/" + r.PathValue("id") + ":" + strconv.Itoa(port)
}

// openPort connects a tunnel to port of m for user, through m's agent.
func (h *Hub) openPort(ctx context.Context, user string, m *model.Machine, port int) (*tunnel.Conn, error) {
	if err := mayForward(user, m); err != nil {
		return nil, err
	}
	t, err := h.dialBack(ctx, user, m, klientapi.MethodPortConnect, m.Label+":"+strconv.Itoa(port), func(tok string, a klientapi.Attach) any {
		return klientapi.PortConnectParams{Port: port, Token: tok, Attach: a}
	})
	if errors.Is(err, kite.ErrMethodNotFound) {
		return nil, fmt.Errorf("the agent of machine %s predates port forwarding: restart the machine to update it: %w", m.Label, kite.ErrState)
	}
	if err != nil {
		return nil, fmt.Errorf("port %d of machine %s: %w", port, m.Label, err)
	}
	return t, nil
}

// dialBack calls method on m's agent with the params params makes of user's token and a fresh
// one-time attachment, and returns the tunnel klient dials back to the attach endpoint for it
// (named name). Errors are the agent's.
func (h *Hub) dialBack(ctx context.Context, user string, m *model.Machine, method, name string, params func(token string, a klientapi.Attach) any) (*tunnel.Conn, error) {
	agent, err := h.o.Agents.Agent(ctx, m)
	if err != nil {
		return nil, err
	}
	tok, err := h.userToken(user, m)
	if err != nil {
		return nil, err
	}
	ticket, ch := h.newTicket()
	defer h.dropTicket(ticket)
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := agent.Call(cctx, method, params(tok, klientapi.Attach{URL: h.attachURL(m), Ticket: ticket}), nil); err != nil {
		select {
		case a := <-ch:
			a.ws.CloseNow()
		default:
		}
		return nil, err
	}
	select {
	case a := <-ch:
		return tunnel.New(a.ws, name, a.peer), nil
	case <-cctx.Done():
		return nil, fmt.Errorf("klient answered %s but its tunnel never arrived: %w", method, kite.ErrTimeout)
	}
}

// ServeTCP is GET /api/machines/{id}/ports/{port}/tcp: a `kloud port-forward` connection, a
// WebSocket tunnel to the port.
func (h *Hub) ServeTCP(w http.ResponseWriter, r *http.Request) {
	port, err := pathPort(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	h.serveTunnel(w, r, tunnelKind{allowed: mayForward, target: portTarget(r, port), open: ActionForwardOpen, close: ActionForwardClose,
		what: "port-forward", dial: func(ctx context.Context, user string, m *model.Machine) (*tunnel.Conn, error) {
			return h.openPort(ctx, user, m, port)
		}, log: []any{"port", port}})
}

// tunnelKind is what serveTunnel serves: who may, the audit entries, and the far end.
type tunnelKind struct {
	allowed     func(user string, m *model.Machine) error
	target      string // the audit entries' target
	open, close string // the audit actions
	what        string // "port-forward", "SSH": in messages and logs
	dial        func(ctx context.Context, user string, m *model.Machine) (*tunnel.Conn, error)
	log         []any // more attributes of the log lines
}

// serveTunnel authenticates r, checks the user may (k.allowed), dials the far end, accepts the
// client's WebSocket and pipes the two until both ended, auditing every attempt of a known user
// and the tunnel's end (duration, bytes). Traffic from the client is activity on the machine.
func (h *Hub) serveTunnel(w http.ResponseWriter, r *http.Request, k tunnelKind) {
	user, m, err := h.target(r, k.allowed)
	refused := func(err error) {
		if user != "" {
			h.attempt(r, k.open, user, k.target, Status(err))
		}
	}
	if err != nil {
		refused(err)
		writeErr(w, err)
		return
	}
	if !h.sameOrigin(r) {
		refused(&statusError{http.StatusForbidden, "cross-origin"})
		kloudhttp.WriteError(w, http.StatusForbidden, "cross-origin "+k.what+" requests are refused")
		return
	}
	far, err := k.dial(r.Context(), user, m)
	if err != nil {
		refused(err)
		writeErr(w, err)
		return
	}
	tunnel.Header(w.Header())
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: h.o.Browser.OriginPatterns(h.o.PublicURL)})
	if err != nil {
		far.CloseWith(tunnel.CloseNormal, "the client went away")
		return
	}
	near := &countingConn{Conn: tunnel.New(ws, "client", r.Header), touch: func() { h.touch(m.ID) }}
	defer h.track(r, func() { // revoke.go
		far.CloseWith(tunnel.CloseNormal, RevokedReason)
		ws.Close(websocket.StatusPolicyViolation, RevokedReason)
	})()
	log := h.log.With(append([]any{"machine", m.ID, "user", user}, k.log...)...)
	log.Info(k.what + " opened")
	h.attempt(r, k.open, user, k.target, http.StatusOK)
	h.touch(m.ID) // a connection, and the client's traffic (countingConn), are activity
	opened := time.Now()
	err = tunnel.Pipe(near, far)
	log.Info(k.what+" closed", "err", err)
	h.closedAudit(r, k.close, user, k.target, time.Since(opened), near.n.Load())
}

// countingConn counts the bytes read and written through a tunnel (for the audit log) and
// notes activity on each read of the client's traffic. It keeps the tunnel's half-close
// (CloseWrite).
type countingConn struct {
	*tunnel.Conn
	n     atomic.Int64
	touch func() // nil: no activity noted
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	if n > 0 && c.touch != nil {
		c.touch()
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}
