// Command p2kloud is kloud in process with pprof, for `p2 -server kloud`; see package
// kloudserver.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kloud-dev/kloud/bench/p2/kloudserver"
)

func main() {
	dataDir := flag.String("data-dir", "", "kloud data dir")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := kloudserver.Serve(ctx, *dataDir, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "p2kloud:", err)
		os.Exit(1)
	}
}
