package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/bench/p1"
	"github.com/kloud-dev/kloud/bench/p2"
	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestMain lets P2 run this test binary as its helper servers (p2 starts Self -serve-raw and
// Self -serve-kontrol -data-dir D), as bench/cmd/p2 does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "-serve-raw" || os.Args[1] == "-serve-kontrol") {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		var err error
		if os.Args[1] == "-serve-raw" {
			err = p2.ServeRaw(ctx, os.Stdout)
		} else if len(os.Args) == 4 && os.Args[2] == "-data-dir" {
			err = p2.ServeKontrol(ctx, os.Args[3], os.Stdout, os.Stderr)
		} else {
			err = fmt.Errorf("usage: -serve-kontrol -data-dir DIR")
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestP1Smoke runs P1 small: both targets answer, the report has every figure. No timing is
// asserted (the figures are for bench/cmd/p1).
func TestP1Smoke(t *testing.T) {
	rep, err := p1.Run(t.Context(), p1.Options{Rounds: 1, Calls: 200, Warmup: 20, Duration: 100 * time.Millisecond, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.Write(&out)
	t.Log("\n" + out.String())
	for _, s := range []p1.Side{rep.Raw, rep.Kite} {
		if s.P50 <= 0 || s.CallsPerS[1] <= 0 || s.CallsPerS[32] <= 0 {
			t.Errorf("missing figures: %+v", s)
		}
	}
}

// TestP2Smoke runs P2 small against kite+kontrol alone (this binary as the server): every kite
// registers and every query finds its kite, and the helper processes are gone afterwards.
func TestP2Smoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes and opens a few hundred connections")
	}
	rep, err := p2.Run(t.Context(), p2.Options{Server: p2.ServerKontrol, Kites: 200, Dialers: 50, Queries: 200, Raw: true, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.Write(&out)
	t.Log("\n" + out.String())
	if rep.Reg.OK != 200 || rep.Reg.Failed != 0 {
		t.Errorf("registered %d, failed %d (%s), want 200 and 0", rep.Reg.OK, rep.Reg.Failed, rep.Reg.FirstErr)
	}
	if rep.Raw == nil || rep.Raw.OK != 200 {
		t.Errorf("raw baseline: %+v", rep.Raw)
	}
	if rep.QueryErr != "" || rep.QueryN != 200 {
		t.Errorf("queries: %d done, error %q", rep.QueryN, rep.QueryErr)
	}
	if rep.Loaded.VmRSS <= 0 {
		t.Errorf("no RSS read: %+v", rep.Loaded)
	}
}

// TestP2Replicas runs P2's replicas mode tiny: three real `kloud serve --replicas` on one
// `kloud store serve`, 30 kites round robin, queries asked on a replica that does not hold the
// kite, then one replica SIGKILLed: every kite it held must be registered again on the others
// (and found there by a query on the survivor that does not hold it). No timing is asserted.
func TestP2Replicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a store server and three kloud replicas")
	}
	if os.Getenv("KLOUD_BENCH_REPLICAS") == "" {
		// Written while the machine was reserved for a CI run and never run: opt in until it has
		// passed once.
		t.Skip("SKIPPED: TestP2Replicas has never been run; set KLOUD_BENCH_REPLICAS=1 to run it")
	}
	kloud := testutil.BuildBinary(t, "./cmd/kloud")
	rep, err := p2.RunReplicas(t.Context(), p2.Options{Kloud: kloud, Kites: 30, Dialers: 10, Queries: 60, Raw: true,
		TempDir: t.TempDir(), FailoverTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.Write(&out)
	t.Log("\n" + out.String())
	if rep.Reg.OK != 30 || rep.Reg.Failed != 0 {
		t.Errorf("registered %d, failed %d (%s), want 30 and 0", rep.Reg.OK, rep.Reg.Failed, rep.Reg.FirstErr)
	}
	for i, h := range rep.Held {
		if h != 10 {
			t.Errorf("replica %d holds %d kites, want 10 (round robin): %v", i, h, rep.Held)
		}
		if rep.Loaded[i].VmRSS <= 0 {
			t.Errorf("replica %d: no RSS read", i)
		}
	}
	if rep.QueryErr != "" || rep.Query.N != 60 {
		t.Errorf("queries: %d done, error %q", rep.Query.N, rep.QueryErr)
	}
	if rep.KilledKites != 10 || rep.Back != rep.KilledKites {
		t.Errorf("failover: %d of the killed replica's %d kites back, want 10 of 10", rep.Back, rep.KilledKites)
	}
	if rep.QueryAfterErr != "" || rep.QueryAfter.N == 0 {
		t.Errorf("queries after the failover: %d done, error %q", rep.QueryAfter.N, rep.QueryAfterErr)
	}
}
