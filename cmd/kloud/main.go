// Command kloud runs the Kloud server and is its command-line client; see package cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	launcher "github.com/kloud-dev/kloud/internal/sandbox"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

func main() {
	sandbox.MaybeRunInit() // kloud re-executes itself as local machines' PID 1 when it starts them
	launcher.MaybeRun()    // and as the sandbox launcher of the provider plugins it starts
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
