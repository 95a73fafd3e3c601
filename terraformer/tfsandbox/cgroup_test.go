package tfsandbox_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// runSandboxed runs /bin/sh -c script through the launcher (this test binary) with cfg and
// returns its combined output and error.
func runSandboxed(t *testing.T, cfg tfsandbox.Config, run, script string) ([]byte, error) {
	t.Helper()
	senv, err := cfg.Env(run)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-c", script)
	cmd.Env = os.Environ()
	for k, v := range senv {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.WaitDelay = 10 * time.Second
	return cmd.CombinedOutput()
}

// TestForkBombUnderPidsLimit: a fork loop inside the sandbox with a pids limit gets EAGAIN
// ("Cannot fork") before it has its 200 processes, this process keeps forking, and the
// sandbox's cgroup is gone once it has ended.
func TestForkBombUnderPidsLimit(t *testing.T) {
	testutil.RequireRoot(t)
	hs, err := cgroups.Hierarchies()
	if err != nil || hs["pids"].Mount == "" {
		testutil.Unavailable(t, "no pids cgroup controller: %v", err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	run := "bomb-" + hex.EncodeToString(b)
	cfg := tfsandbox.Config{Program: "/bin/sh", CgroupPrefix: "tftest-",
		Limits: &cgroups.Limits{PidsMax: 32, MemoryBytes: 256 << 20, CPUs: 0.5}}
	dir := filepath.Join(hs["pids"].Mount, "kloud", "tftest-"+run)
	t.Cleanup(func() { _ = tfsandbox.RemoveCgroup(cfg, run) })

	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runSandboxed(t, cfg, run,
			`n=0; while [ $n -lt 200 ]; do sleep 60 & n=$((n+1)); done; echo "all $n started"`)
		done <- result{out, err}
	}()
	var res result
	sawGroup := false
wait:
	for {
		select {
		case res = <-done:
			break wait
		case <-time.After(20 * time.Millisecond):
		}
		if _, err := os.Stat(dir); err == nil {
			sawGroup = true
		}
		// The host is unaffected: this process still forks.
		if err := exec.Command("true").Run(); err != nil {
			t.Fatalf("the test process cannot fork while the sandbox forks: %v", err)
		}
	}
	t.Logf("sandbox: %v: %s", res.err, bytes.TrimSpace(res.out))
	if !sawGroup {
		t.Errorf("the sandbox's cgroup %s never existed", dir)
	}
	if bytes.Contains(res.out, []byte("all 200 started")) {
		t.Errorf("200 processes started in a sandbox limited to 32: %s", res.out)
	}
	if res.err == nil || !bytes.Contains(res.out, []byte("fork")) {
		t.Errorf("the shell was not refused a fork: %v %s", res.err, res.out)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s left after the sandbox ended: %v", dir, err)
	}
	for _, rel := range cgroups.Orphans("tftest-") {
		t.Errorf("cgroup %s left", rel)
	}
}

// TestTerraformRunUnderLimits: a terraform run of an engine with SandboxLimits is in a cgroup of
// its own (a local-exec provisioner reads /proc/self/cgroup) with those limits: its fork loop is
// refused forks, the apply fails, and the cgroup is gone after the job.
func TestTerraformRunUnderLimits(t *testing.T) {
	t.Parallel()
	hs, err := cgroups.Hierarchies()
	if err != nil || hs["pids"].Mount == "" {
		testutil.RequireRoot(t)
		testutil.Unavailable(t, "no pids cgroup controller: %v", err)
	}
	e := tfruntest.NewEngine(t, tfrun.Options{SandboxLimits: &cgroups.Limits{PidsMax: 200, MemoryBytes: 1 << 30, CPUs: 1}})
	j := apply(t, e, "fork-bomb", `
resource "terraform_data" "bomb" {
  provisioner "local-exec" {
    command = "grep pids /proc/self/cgroup; n=0; while [ $n -lt 400 ]; do sleep 60 >/dev/null 2>&1 & n=$((n+1)); done; echo all $n started"
  }
}`)
	b, _ := os.ReadFile(filepath.Join(e.Options().Dir, "jobs", j.ID+".log"))
	t.Logf("job %s: %v", j.Status, j.Err())
	if j.Status != tfrun.StatusFailed || bytes.Contains(b, []byte("all 400 started")) {
		t.Errorf("status %s: the provisioner started its 400 processes:\n%s", j.Status, b)
	}
	if !bytes.Contains(b, []byte("fork")) {
		t.Errorf("no refused fork in the log:\n%s", b)
	}
	m := regexp.MustCompile(`pids:(/kloud/tf-[0-9a-f]+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("the provisioner is not in a kloud/tf-* pids cgroup")
	}
	dir := filepath.Join(hs["pids"].Mount, string(m[1]))
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	}, "cgroup %s left after the job", dir)
}

// TestRemoveLeftovers: an empty group a killed launcher left is removed; a group with a process
// (another program's live run) is left alone, and so is a group made in the last minute.
func TestRemoveLeftovers(t *testing.T) {
	testutil.RequireRoot(t)
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "tftest-lo" + hex.EncodeToString(b) + "-"
	empty, busy := "kloud/"+prefix+"empty", "kloud/"+prefix+"busy"
	for _, rel := range []string{empty, busy} {
		if _, err := cgroups.Create(rel, cgroups.Limits{PidsMax: 16}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cgroups.KillAll(rel, 5*time.Second)
			_ = cgroups.Remove(rel)
		})
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	hs, _ := cgroups.Hierarchies()
	for _, d := range cgroups.Dirs(hs, busy) {
		if err := cgroups.Join([]string{filepath.Join(d, "cgroup.procs")}, sleep.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	// Both are new: the empty one may be a launcher's that has not joined it yet.
	if removed, err := tfsandbox.RemoveLeftovers(prefix); err != nil || len(removed) != 0 {
		t.Errorf("RemoveLeftovers of groups a second old = %v, %v; want none", removed, err)
	}
	removed, err := tfsandbox.RemoveLeftoversOlder(prefix, 0)
	if err != nil || len(removed) != 1 || removed[0] != empty {
		t.Errorf("RemoveLeftovers = %v, %v; want [%s]", removed, err, empty)
	}
	got := cgroups.Orphans(prefix)
	if len(got) != 1 || got[0] != busy {
		t.Errorf("groups left: %v, want [%s]", got, busy)
	}
}
