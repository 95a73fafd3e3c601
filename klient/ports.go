package klient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// Port forwarding: port.connect connects a TCP port of this machine (on its loopback, where a
// developer's server usually listens; klient dials it with its own privileges) to a tunnel
// WebSocket that klient dials back to kloud's attach endpoint (the same origin check as
// webterm.connect: kontrol's origin, nothing else). kloud relays the tunnel to the user's
// browser (a machine's web app) or `kloud port-forward`. The owner and terminal or full shares
// may forward; a read-only share may not.

// portDialTimeout bounds dialing the machine's port.
const portDialTimeout = 5 * time.Second

func (kl *Klient) handlePorts() {
	kl.kite.Handle(klientapi.MethodPortConnect, kite.Typed(kl.portConnect), kite.WithTimeout(time.Minute))
}

func (kl *Klient) portConnect(ctx context.Context, r *kite.Request, p *klientapi.PortConnectParams) (any, error) {
	user, _, err := kl.authorize(ctx, r, p.Token, permTerminal)
	if err != nil {
		return nil, err
	}
	tcp, err := dialPort(ctx, p.Port)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%s: nothing listens on port %d of this machine (start the server on 127.0.0.1 or 0.0.0.0 first): %w", r.Method, p.Port, kite.ErrUnavailable)
		}
		return nil, fmt.Errorf("%s: connect to port %d: %w: %w", r.Method, p.Port, err, kite.ErrUnavailable)
	}
	t, err := kl.dialTunnel(ctx, p.Attach)
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("%s: %w: %w", r.Method, err, kite.ErrState)
	}
	kl.log.Info("port forward opened", "port", p.Port, "user", user)
	go func() {
		err := tunnel.Pipe(t, tcp)
		kl.log.Info("port forward closed", "port", p.Port, "user", user, "err", err)
	}()
	return klientapi.PortConnectResult{Port: p.Port}, nil
}

// dialTunnel dials kloud's attach endpoint for attachment a (within attachDialTimeout) and
// returns the tunnel over it, its messages sized to what kloud said it reads.
func (kl *Klient) dialTunnel(ctx context.Context, a klientapi.Attach) (*tunnel.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, attachDialTimeout)
	defer cancel()
	ws, h, err := webterm.DialHeader(actx, a, kl.opts.KontrolURL, kl.hc, tunnel.Header(nil))
	if err != nil {
		return nil, err
	}
	return tunnel.New(ws, "kloud", h), nil
}

// dialPort connects to port on the machine's loopback: 127.0.0.1, else ::1 (a server bound to
// "localhost" may listen on either).
func dialPort(ctx context.Context, port int) (net.Conn, error) {
	var d net.Dialer
	var first error
	for _, host := range []string{"127.0.0.1", "::1"} {
		dctx, cancel := context.WithTimeout(ctx, portDialTimeout)
		c, err := d.DialContext(dctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		cancel()
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.ENETUNREACH) {
			break
		}
	}
	return nil, first
}
