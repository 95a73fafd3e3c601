// Command kloud runs the Kloud server and is its command-line client; see package cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kloud-dev/kloud/kloud/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
