// Command storeserver serves a FerretDB (SQLite backend, as kloud's embedded store) on a unix
// socket for tests: storetest.Shared starts one per test process, so that the database runs
// outside the race-instrumented test binary (in it, FerretDB builds in its debug mode and
// SQLite is instrumented: half of the kloud package's CPU went there).
//
// It serves DIR/db.sock with its data in DIR, prints "ready" once it accepts connections, and
// stops when its standard input ends (the test process that started it exited, however it
// ended) or on SIGTERM or SIGINT, then removes DIR.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"

	"github.com/kloud-dev/kloud/kloud/store"
)

func main() {
	dir := flag.String("dir", "", "data directory; the socket is DIR/db.sock (required)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "storeserver: -dir is required")
		os.Exit(2)
	}
	if err := run(*dir); err != nil {
		fmt.Fprintln(os.Stderr, "storeserver:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	defer os.RemoveAll(dir)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the parent's end closes our stdin
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	sock := filepath.Join(dir, "db.sock")
	f, err := store.NewFerretDB(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{Unix: sock},
		Handler:   "sqlite",
		SQLiteURL: "file:" + dir + "/",
		// Errors only: FerretDB v1 warns of every command it lacks (endSessions, at every
		// client's close).
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return fmt.Errorf("start ferretdb: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx)
	}()
	if err := waitDial(ctx, sock); err != nil {
		return err
	}
	fmt.Println("ready")
	<-done
	return nil
}

// waitDial waits until the socket accepts a connection.
func waitDial(ctx context.Context, sock string) error {
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ferretdb on %s: %w", sock, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
