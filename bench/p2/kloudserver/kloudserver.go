// Package kloudserver runs kloud in process for P2's profiles (bench/p2, -server kloud): the
// same kloud.New as `kloud serve`, plus p2.DebugHandlers. It is a package of its own so that the
// load generator and the raw baseline server do not link kloud.
package kloudserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/kloud-dev/kloud/bench/p2"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kloud"
)

// Serve runs kloud the way `kloud serve` does (kloud.New with the data dir, a text logger on
// logw, the default heartbeat) plus p2.DebugHandlers, on a free loopback port, and prints
// "kloud <version> listening on ADDR" to out as kloud serve does. It serves until ctx ends.
func Serve(ctx context.Context, dataDir string, out, logw io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("serve kloud: %w", err)
	}
	addr := ln.Addr().String()
	s, err := kloud.New(ctx, kloud.Options{
		DataDir: dataDir, Addr: addr, PublicURL: "http://" + addr,
		Logger: slog.New(slog.NewTextHandler(logw, nil)),
		Listening: func(a net.Addr) {
			fmt.Fprintf(out, "kloud %s listening on %s\n", version.Version, a)
		},
	})
	if err != nil {
		ln.Close()
		return fmt.Errorf("serve kloud: %w", err)
	}
	p2.DebugHandlers(s.Handle)
	return s.ServeListener(ctx, ln)
}
