// Command p1 runs the P1 benchmark (a kite call round trip against a raw WebSocket echo) and
// prints the comparison; see package p1.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/bench/p1"
)

func main() {
	var o p1.Options
	quiet := flag.Bool("q", false, "do not print a line per measurement")
	flag.IntVar(&o.Rounds, "rounds", 3, "rounds (raw and kite alternate; medians are reported)")
	flag.IntVar(&o.Calls, "calls", 20000, "sequential calls timed per round")
	flag.IntVar(&o.Warmup, "warmup", 2000, "untimed calls before them")
	flag.DurationVar(&o.Duration, "duration", 2*time.Second, "length of each throughput run")
	flag.Parse()
	if !*quiet {
		o.Progress = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	rep, err := p1.Run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "p1:", err)
		os.Exit(1)
	}
	rep.Write(os.Stdout)
}
