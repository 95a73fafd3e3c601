package stackbuild_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfclient"
)

// TestTFWait: a call that found terraformer unavailable (restarting) is tried again, saying so
// once, until Max; then it gives up with an error that says how long it waited and keeps the
// unavailable code. Other errors are not waited for.
func TestTFWait(t *testing.T) {
	t.Parallel()
	down := fmt.Errorf("terraformer.apply: %w", &tfclient.UnavailableError{Cause: errors.New("terraformer (pid 7) exited (signal: killed); restarting it in 6.691s")})
	var w stackbuild.TFWait
	if w.Retry(t.Context(), fmt.Errorf("locked: %w", kite.ErrConflict), nil) || w.Retry(t.Context(), nil, nil) {
		t.Fatal("retried an error that is not unavailability")
	}
	w = stackbuild.TFWait{Max: 1200 * time.Millisecond}
	var said []string
	say := func(s string) { said = append(said, s) }
	tries := 0
	for w.Retry(t.Context(), down, say) {
		tries++
		if tries > 10 {
			t.Fatal("no bound")
		}
	}
	if tries < 2 || len(said) != 1 || !strings.Contains(said[0], "waiting for the terraformer (restarting)") {
		t.Fatalf("%d tries, said %q", tries, said)
	}
	if !w.Gave(down) {
		t.Fatal("Gave is false after the bound")
	}
	err := w.Err(down)
	if !strings.Contains(err.Error(), "terraformer did not come back within 1.2s") || !errors.Is(err, kite.ErrUnavailable) {
		t.Fatalf("error after the bound: %v", err)
	}
	if other := errors.New("x"); w.Err(other) != other {
		t.Fatal("Err changed an error it did not give up on")
	}
}

// TestRunDied: a run is started again only when its process went away (terraformer restarted
// or closed, or it does not know the run), never when terraform itself failed or it was
// cancelled.
func TestRunDied(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]bool{
		fmt.Errorf("job j failed: %w", &tfapi.JobError{Kind: tfapi.KindRestarted}): true,
		&tfapi.JobError{Kind: tfapi.KindClosing}:                                   true,
		fmt.Errorf("wait for job j: %w", kite.ErrNotFound):                         true,
		&tfapi.JobError{Kind: tfapi.KindTerraform}:                                 false,
		&tfapi.JobError{Kind: tfapi.KindCancelled}:                                 false,
		&tfapi.JobError{Kind: tfapi.KindHung}:                                      false,
		fmt.Errorf("x: %w", kite.ErrUnavailable):                                   false,
	} {
		if got := stackbuild.RunDied(err); got != want {
			t.Errorf("RunDied(%v) = %v, want %v", err, got, want)
		}
	}
}
