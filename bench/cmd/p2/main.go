// Command p2 runs the P2 benchmark (kontrol in a real `kloud serve` process with 10,000
// simulated kites) and prints the figures; see package p2. With -replicas 3 it is P2 across
// three kloud replicas on one store server, and their failover (p2.RunReplicas). With -serve-raw
// it is the baseline's WebSocket echo server instead (p2 starts it so).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/bench/p2"
)

func main() {
	var o p2.Options
	serveRaw := flag.Bool("serve-raw", false, "run the baseline WebSocket echo server (used by p2 itself)")
	serveKontrol := flag.Bool("serve-kontrol", false, "run kite+kontrol alone with pprof (used by p2 itself with -server kontrol)")
	dataDir := flag.String("data-dir", "", "data dir for -serve-kontrol")
	flag.StringVar(&o.Server, "server", p2.ServerBinary, "what serves the kites: binary (kloud serve), kloud (kloud.New in process) or kontrol (kite+kontrol alone)")
	flag.StringVar(&o.Profile, "profile", "", "directory for the server's CPU, heap and goroutine profiles (with -server kloud or kontrol)")
	flag.DurationVar(&o.RegisterTimeout, "register-timeout", 3*time.Minute, "bound on the registration phase")
	quiet := flag.Bool("q", false, "do not print a line per step")
	noRaw := flag.Bool("no-raw", false, "skip the raw WebSocket baseline")
	flag.StringVar(&o.Kloud, "kloud", "", "kloud binary (default: go build ./cmd/kloud into the temp dir)")
	flag.IntVar(&o.Kites, "kites", 10000, "simulated kites")
	flag.IntVar(&o.Dialers, "dialers", 200, "connections opened at once")
	flag.IntVar(&o.Queries, "queries", 10000, "kontrol.query calls timed")
	flag.BoolVar(&o.Keep, "keep", false, "keep the temp dir (data dir and logs)")
	flag.IntVar(&o.Replicas, "replicas", 0, "run across this many `kloud serve --replicas` on one `kloud store serve` (0: one kloud serve), then SIGKILL one and time the failover")
	flag.DurationVar(&o.FailoverTimeout, "failover-timeout", 3*time.Minute, "with -replicas: bound on the wait for the killed replica's kites to be back")
	flag.BoolVar(&o.KiteKeys, "kite-keys", false, "with -replicas: kontrol.createKey kite keys instead of machine agent keys (not found across replicas)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *serveRaw {
		if err := p2.ServeRaw(ctx, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "p2 -serve-raw:", err)
			os.Exit(1)
		}
		return
	}
	if *serveKontrol {
		if err := p2.ServeKontrol(ctx, *dataDir, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "p2 -serve-kontrol:", err)
			os.Exit(1)
		}
		return
	}
	o.Raw = !*noRaw
	if !*quiet {
		o.Progress = os.Stderr
	}
	if o.Replicas > 0 {
		rep, err := p2.RunReplicas(ctx, o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "p2:", err)
			os.Exit(1)
		}
		rep.Write(os.Stdout)
		return // a missed target is a result, not a failure of the program
	}
	rep, err := p2.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "p2:", err)
		os.Exit(1)
	}
	rep.Write(os.Stdout)
	if !rep.Pass() {
		os.Exit(0) // a missed target is a result, not a failure of the program
	}
}
