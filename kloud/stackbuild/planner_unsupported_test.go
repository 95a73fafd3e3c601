package stackbuild_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/provider"
)

// unsupportedConsole is a machine that has ConsoleLog but whose provider does not offer it (a
// plugin's proxy machine without the consoleLog capability).
type unsupportedConsole struct {
	noConsole
	calls *int
}

func (m unsupportedConsole) ConsoleLog(context.Context) (string, error) {
	*m.calls++
	return "", fmt.Errorf("console log: %w", provider.ErrUnsupported)
}

// TestPlannerConsoleUnsupported: a machine whose ConsoleLog says ErrUnsupported is waited for
// like one without ConsoleLog: the same step when its agent does not come, and its console is
// asked once, not polled.
func TestPlannerConsoleUnsupported(t *testing.T) {
	t.Parallel()
	pl := &stackbuild.Planner{Agents: neverAgents{}, Timeout: time.Second, ConsolePoll: 50 * time.Millisecond, Log: testutil.Logger(t)}
	calls := 0
	got := pl.Wait(t.Context(), []stackbuild.Expect{{Label: "plugin", KiteID: "k1", Machine: unsupportedConsole{calls: &calls}, Fresh: true}}, nil)[0]
	want := pl.Wait(t.Context(), []stackbuild.Expect{{Label: "plugin", KiteID: "k2", Machine: noConsole{}, Fresh: true}}, nil)[0]
	if got.OK || got.Step != want.Step || got.Step != stackbuild.StepRegistration || got.LogTail != "" {
		t.Errorf("result %+v, want step %s like a machine without console", got, want.Step)
	}
	if calls > 2 { // the watcher's one read and the diagnosis
		t.Errorf("ConsoleLog called %d times", calls)
	}
}
