package userdata

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestCloudInitStagesUnavailable runs the stages program under the host's Python with no site
// packages (-S: never the host's cloud-init, whose stages must not run here): it compiles, says
// why it runs nothing, and exits StagesUnavailable, the code the providers fall back on. The
// program's real run, cloud-init's four stages in one process, is the sandbox's and docker's
// boot (providers/local/sandbox TestCloudInitStagesInOneProcess).
func TestCloudInitStagesUnavailable(t *testing.T) {
	py := testutil.RequireBinary(t, "python3")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-S", "-c", CloudInitStages, "kloud-test").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != StagesUnavailable {
		t.Fatalf("exit %v, want %d:\n%s", err, StagesUnavailable, out)
	}
	if !strings.Contains(string(out), "kloud-test: cannot import cloud-init (ModuleNotFoundError") {
		t.Errorf("output:\n%s", out)
	}
}
