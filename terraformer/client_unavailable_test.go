package terraformer_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
)

// TestClientUnavailable: a client whose terraformer is marked down, or does not answer at all,
// fails calls at once (well before the call timeout) with "terraformer unavailable: <cause>",
// code -32009 on the wire; once it is up again, calls work.
func TestClientUnavailable(t *testing.T) {
	t.Parallel()
	e := terraformertest.Start(t, terraformertest.Options{})
	c := e.Client
	if _, err := c.Job(t.Context(), "0123456789abcdef01234567"); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("job on a live terraformer: %v, want not found", err)
	}

	c.SetUnavailable(errors.New("exited (signal: killed); restarting in 100ms"))
	start := time.Now()
	_, err := c.Plan(t.Context(), terraformer.Request{ContentID: "x", Files: files(`resource "terraform_data" "a" {}`)})
	if took := time.Since(start); took > time.Second {
		t.Errorf("a call while terraformer is marked down took %s", took)
	}
	var ue *terraformer.UnavailableError
	if !errors.Is(err, kite.ErrUnavailable) || !errors.As(err, &ue) {
		t.Fatalf("plan while down: %v, want an unavailable error", err)
	}
	if want := "terraformer.plan: terraformer unavailable: exited (signal: killed); restarting in 100ms"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if we := kite.ToWire(err); we.Code != kite.CodeUnavailable || !strings.Contains(we.Message, "terraformer unavailable") {
		t.Errorf("on the wire: %d %q", we.Code, we.Message)
	}
	c.SetAvailable()
	if _, err := c.Job(t.Context(), "0123456789abcdef01234567"); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("job after SetAvailable: %v", err)
	}

	// Nobody listening: the call gives up after ConnectWait with the dial error as the cause.
	dead := terraformertest.NewClient(t, "http://"+testutil.FreeLoopback(t), e.KiteKeyAuth("kloud"))
	dead.ConnectWait = 500 * time.Millisecond
	start = time.Now()
	_, err = dead.Outputs(t.Context(), "x")
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("a call to a terraformer that is not there took %s", took)
	}
	if !errors.Is(err, kite.ErrUnavailable) || !strings.Contains(err.Error(), "terraformer unavailable") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("call to nobody: %v", err)
	}
	// Wait follows a job through a restart, but not forever.
	dead.WaitDown = 500 * time.Millisecond
	dead.SetUnavailable(errors.New("exited (exit status 1); restarting it in 10s"))
	start = time.Now()
	j, err := dead.Wait(t.Context(), "0123456789abcdef01234567", nil)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Wait for a terraformer that stays down took %s", took)
	}
	if j != nil || !errors.Is(err, kite.ErrUnavailable) || !strings.Contains(err.Error(), "restarting it in 10s") {
		t.Fatalf("Wait while down: %v %v", j, err)
	}
}
