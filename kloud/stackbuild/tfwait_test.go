package stackbuild_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/supervise"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
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

	// A start under way when the bound passes is waited for; once it failed (the supervisor
	// backs off again), the wait gives up.
	starting := fmt.Errorf("terraformer.plan: %w", &tfclient.UnavailableError{Cause: &supervise.StartingError{After: "terraformer (pid 7) exited (signal: killed)"}})
	w = stackbuild.TFWait{Max: 600 * time.Millisecond}
	start := time.Now()
	for time.Since(start) < 1500*time.Millisecond {
		if !w.Retry(t.Context(), starting, nil) {
			t.Fatalf("gave up %s into a start under way, Max 600ms", time.Since(start).Round(time.Millisecond))
		}
	}
	if w.Retry(t.Context(), down, nil) || !w.Gave(down) {
		t.Fatal("still waiting past Max once the start failed")
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

// logJob is a stackbuild.Job that keeps its log lines.
type logJob struct{ lines []string }

func (j *logJob) Doc() store.Job                                 { return store.Job{} }
func (j *logJob) Enter(context.Context, stackbuild.Stage)        {}
func (j *logJob) EnterAt(context.Context, stackbuild.Stage, int) {}
func (j *logJob) Logf(_ context.Context, format string, args ...any) {
	j.lines = append(j.lines, fmt.Sprintf(format, args...))
}

// TestSubmitTFThroughShutdown (issue 23, chaos kloud-destroy): a run submitted to a terraformer
// that is shutting down (its engine closed: the old kloud's terraformer, dying with it, still
// answering on the address the new kloud's terraformer takes over) is submitted again once the
// next terraformer answers, saying so in the job's log, instead of failing the job with
// "terraformer is shutting down". Real terraformers (terraformertest: the kite service over a
// real engine and terraform).
func TestSubmitTFThroughShutdown(t *testing.T) {
	t.Parallel()
	old := terraformertest.Start(t, terraformertest.Options{})
	next := terraformertest.Start(t, terraformertest.Options{})
	if err := old.Engine.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	req := tfapi.Request{ContentID: "going", Files: tfapi.Files(map[string][]byte{"main.tf": []byte(`resource "terraform_data" "a" {}`)})}
	_, err := old.Client.Destroy(t.Context(), req)
	if !stackbuild.TerraformerGone(err) || !strings.Contains(err.Error(), "terraformer is shutting down") {
		t.Fatalf("destroy on a terraformer shutting down: %v, want an error saying it is going away", err)
	}
	var j logJob
	calls := 0
	id, err := stackbuild.SubmitTF(t.Context(), &j, func() (string, error) {
		calls++
		if calls == 1 {
			return old.Client.Destroy(t.Context(), req)
		}
		return next.Client.Destroy(t.Context(), req) // the terraformer that replaced it
	})
	if err != nil || id == "" || calls != 2 {
		t.Fatalf("SubmitTF: %q, %v after %d calls; log %q", id, err, calls, j.lines)
	}
	if len(j.lines) != 1 || !strings.Contains(j.lines[0], "waiting for the terraformer") {
		t.Errorf("job log %q", j.lines)
	}
	if job, err := next.Client.Wait(t.Context(), id, nil); err != nil {
		t.Fatalf("the run submitted again: %v %+v", err, job)
	}
}

// TestTerraformerGone: what a terraformer that is going away answers is waited for; what a live
// one refuses is not.
func TestTerraformerGone(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]bool{
		fmt.Errorf("terraformer.destroy: %w", kite.ErrUnavailable):    true,
		fmt.Errorf("terraformer.apply: %w", kite.ErrClosed):           true,
		fmt.Errorf("terraformer.apply: locked: %w", kite.ErrConflict): false,
		fmt.Errorf("terraformer.apply: %w", kite.ErrState):            false,
		nil: false,
	} {
		if got := stackbuild.TerraformerGone(err); got != want {
			t.Errorf("TerraformerGone(%v) = %v, want %v", err, got, want)
		}
	}
}
