package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/klient/klientapi"
)

// kloud port-forward MACHINE [LOCAL:]REMOTE: a local TCP listener whose every connection is a
// tunnel through kloud to REMOTE on the machine's loopback (kloud's
// /api/machines/{id}/ports/{port}/tcp, then the machine's klient), so no port of the machine
// is open to anyone.

func portForwardCmd(g *globals) *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "port-forward MACHINE [LOCAL:]REMOTE...",
		Short: "Forward local TCP ports to ports of a machine, through kloud",
		Long: `Listen on LOCAL (on --address, default 127.0.0.1) and carry every connection through
kloud to port REMOTE on MACHINE's loopback (its id or label), over the machine's agent
connection: nothing of the machine is exposed. LOCAL defaults to REMOTE; LOCAL 0 picks a free
port (printed). The machine's owner and users it is shared with (terminal or full) may forward.
Stops with Ctrl-C.

In the browser, a machine's web server is at its own origin instead: the machine page's
"Open port" (or GET /api/machines/ID/ports/PORT/open on kloud).`,
		Example: "  kloud port-forward dev.0 8000\n  kloud port-forward dev.0 15432:5432 8080:80",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.portForward(cmd.Context(), cmd.OutOrStdout(), args[0], args[1:], addr)
		},
	}
	cmd.Flags().StringVar(&addr, "address", "127.0.0.1", "local address to listen on")
	return cmd
}

// forwardSpec is one LOCAL:REMOTE.
type forwardSpec struct{ local, remote int }

func parseForward(s string) (forwardSpec, error) {
	l, r, ok := strings.Cut(s, ":")
	if !ok {
		l, r = s, s
	}
	var f forwardSpec
	var err error
	if f.local, err = strconv.Atoi(l); err != nil || f.local < 0 || f.local > 65535 {
		return f, fmt.Errorf("%q: LOCAL must be a port 0-65535 (0: any free port)", s)
	}
	if f.remote, err = strconv.Atoi(r); err != nil || klientapi.CheckPort(f.remote) != nil {
		return f, fmt.Errorf("%q: REMOTE must be a port 1-65535", s)
	}
	return f, nil
}

func (g *globals) portForward(ctx context.Context, out io.Writer, name string, specs []string, addr string) error {
	var fs []forwardSpec
	for _, s := range specs {
		f, err := parseForward(s)
		if err != nil {
			return err
		}
		fs = append(fs, f)
	}
	cred, err := g.credential()
	if err != nil {
		return err
	}
	hc, err := g.httpClient()
	if err != nil {
		return err
	}
	m, err := g.findMachine(ctx, name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(fs))
	for _, f := range fs {
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(f.local)))
		if err != nil {
			return fmt.Errorf("listen for port %d: %w", f.remote, err)
		}
		defer ln.Close()
		fmt.Fprintf(out, "Forwarding %s -> %s:%d\n", ln.Addr(), m.Label, f.remote)
		base := strings.TrimRight(g.url, "/") + "/api/machines/" + url.PathEscape(m.ID) + "/ports/" + strconv.Itoa(f.remote) + "/tcp"
		go func() { errc <- serveForward(ctx, hc, ln, "ws"+strings.TrimPrefix(base, "http"), cred, out) }()
	}
	go func() { <-ctx.Done(); errc <- nil }()
	return <-errc
}

// serveForward accepts local connections and pipes each through its own tunnel.
func serveForward(ctx context.Context, hc *http.Client, ln net.Listener, wsURL, cred string, out io.Writer) error {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			t, err := dialForward(ctx, hc, wsURL, cred)
			if err != nil {
				fmt.Fprintf(out, "connection from %s: %v\n", c.RemoteAddr(), err)
				c.Close()
				return
			}
			tunnel.Pipe(c, t)
		}()
	}
}

func dialForward(ctx context.Context, hc *http.Client, wsURL, cred string) (*tunnel.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, wsURL, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: tunnel.Header(http.Header{"Authorization": {"Bearer " + cred}})})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var e struct{ Error string }
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			if json.Unmarshal(b, &e) != nil || e.Error == "" {
				e.Error = strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("%s: %s", resp.Status, e.Error)
		}
		return nil, err
	}
	return tunnel.New(ws, "kloud", resp.Header), nil
}
