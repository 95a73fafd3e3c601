package terraformer_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

const jobTimeout = 2 * time.Minute

func files(main string) map[string]string { return map[string]string{"main.tf": main} }

// submit starts op through the client and fails the test if terraformer refuses.
func submit(t *testing.T, c *terraformer.Client, op tfrun.Op, req terraformer.Request) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var id string
	var err error
	switch op {
	case tfrun.OpPlan:
		id, err = c.Plan(ctx, req)
	case tfrun.OpApply:
		id, err = c.Apply(ctx, req)
	case tfrun.OpDestroy:
		id, err = c.Destroy(ctx, req)
	}
	if err != nil {
		t.Fatalf("%s %s: %v", op, req.ContentID, err)
	}
	return id
}

// wait waits for the job through the client; it fails the test unless the job ends with want.
func wait(t *testing.T, c *terraformer.Client, id string, want tfrun.Status) *tfrun.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), jobTimeout)
	defer cancel()
	j, err := c.Wait(ctx, id, nil)
	if j == nil {
		t.Fatalf("wait for %s: %v", id, err)
	}
	if j.Status != want {
		t.Fatalf("job %s (%s %s): status %s, want %s; error: %v\nlog:\n%s", id, j.Op, j.ContentID, j.Status, want, err,
			strings.Join(j.Log, "\n"))
	}
	if (err == nil) != (want == tfrun.StatusSucceeded) {
		t.Fatalf("job %s %s but Wait returned error %v", id, j.Status, err)
	}
	return j
}

// run submits and waits.
func run(t *testing.T, c *terraformer.Client, op tfrun.Op, req terraformer.Request, want tfrun.Status) *tfrun.Job {
	t.Helper()
	return wait(t, c, submit(t, c, op, req), want)
}

// The gates below must be in the stack's work dir (tfruntest.WorkDir, proc.workDir): the only host
// directory the sandboxed terraform can write.

// gateCmd is a local-exec command that records its pid, touches <dir>/started, and then (exec'd,
// so the pid is the sleep's) sleeps until killed, unless <dir>/release exists already. A
// terraform_data with it stays "creating" until the test cancels the run; once released, a new
// run passes straight through.
func gateCmd(dir string) string {
	return fmt.Sprintf(`echo $$ > %[1]s/pid; touch %[1]s/started; [ -f %[1]s/release ] || exec sleep 300`, dir)
}

// pollGateCmd is like gateCmd but polls for <dir>/release, so the run finishes by itself once
// the test releases it (at most ~5 minutes).
func pollGateCmd(dir string) string {
	return fmt.Sprintf(`echo $$ > %[1]s/pid; touch %[1]s/started; i=0; while [ ! -f %[1]s/release ] && [ $i -lt 6000 ]; do i=$((i+1)); sleep 0.05; done`, dir)
}

// gated is a stack whose two fast resources are created first, then a slow one that runs cmd.
func gated(cmd string) string {
	return fmt.Sprintf(`
resource "terraform_data" "fast" {
  count = 2
  input = "fast-${count.index}"
}
resource "terraform_data" "slow" {
  depends_on = [terraform_data.fast]
  input      = "slow"
  provisioner "local-exec" {
    command = %q
  }
}
output "slow" { value = terraform_data.slow.output }
`, cmd)
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	testutil.Eventually(t, time.Minute, func() bool {
		_, err := os.Stat(path)
		return err == nil
	}, "%s never appeared", path)
}

func release(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// releaseAtEnd makes sure a gate never outlives the test.
func releaseAtEnd(t *testing.T, dir string) {
	t.Cleanup(func() { os.WriteFile(filepath.Join(dir, "release"), nil, 0o600) })
}

// alive reports whether the process pid runs (a zombie only waits for its reaper: not alive).
func alive(pid string) bool {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
}
