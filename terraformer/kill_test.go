package terraformer_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// sleeper keeps an apply busy with a provisioner's `sleep 300` while the hashicorp/local provider
// plugin is running: local_file.after waits for the sleep, so terraform keeps the provider open.
const sleeper = `
resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command = "touch started; exec sleep 300"
  }
}
resource "local_file" "after" {
  depends_on = [terraform_data.slow]
  content    = "after"
  filename   = "${path.module}/after.txt"
}
`

// waitBusy waits until terraform, the provider plugin and the provisioner's sleep all run in
// work, and returns them.
func waitBusy(t *testing.T, work string) []tfruntest.Process {
	t.Helper()
	var ps []tfruntest.Process
	testutil.Eventually(t, time.Minute, func() bool {
		ps = tfruntest.Processes(work)
		var tf, provider, sleep bool
		for _, p := range ps {
			tf = tf || strings.HasSuffix(p.Exe, "/terraform")
			provider = provider || strings.Contains(p.Exe, "terraform-provider-local")
			sleep = sleep || strings.HasPrefix(p.Cmdline, "sleep 300")
		}
		return tf && provider && sleep
	}, "terraform, the local provider and the provisioner's sleep never ran together in %s", work)
	return ps
}

// TestKillLeavesNothing SIGKILLs the real terraformer mid-apply, and in a second run only the
// sandbox launcher of the apply: either way terraform, its provider plugin and the provisioner's
// sleep are gone within seconds (they lived in the launcher's pid namespace).
func TestKillLeavesNothing(t *testing.T) {
	t.Parallel()
	keys := terraformertest.StartKeys(t)
	p := startProc(t, keys, 2*time.Second)
	c := terraformertest.NewClient(t, p.url(), keys.KiteKeyAuth("kloud"))

	// 1. kill -9 of terraformer.
	work := p.workDir("killed-terraformer")
	submit(t, c, tfrun.OpApply, terraformer.Request{ContentID: "killed-terraformer", Files: files(sleeper)})
	ps := waitBusy(t, work)
	t.Logf("before the kill: %+v", ps)
	p.signal(syscall.SIGKILL)
	tfruntest.AssertNoProcesses(t, 30*time.Second, work)

	// 2. kill -9 of the launcher only: terraformer lives on and fails the job.
	p.start()
	work = p.workDir("killed-launcher")
	id := submit(t, c, tfrun.OpApply, terraformer.Request{ContentID: "killed-launcher", Files: files(sleeper)})
	waitBusy(t, work)
	launchers := children(p.cmd.Process.Pid, "KLOUD_TFSANDBOX_STAGE=launch")
	if len(launchers) != 1 {
		t.Fatalf("launchers of terraformer %d: %v, want one", p.cmd.Process.Pid, launchers)
	}
	// terraformer's default limits: the launcher (and so terraform) is in a kloud/tf-* cgroup.
	var pidsGroup string
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", launchers[0]))
	for _, l := range strings.Split(string(cg), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && strings.Contains(","+f[1]+",", ",pids,") {
			pidsGroup = f[2]
		}
	}
	if !strings.HasPrefix(pidsGroup, "/kloud/tf-") {
		t.Errorf("the launcher is in pids cgroup %q, want /kloud/tf-*", pidsGroup)
	}
	if err := syscall.Kill(launchers[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, work)
	j := wait(t, c, id, tfrun.StatusFailed)
	if hs, _ := cgroups.Hierarchies(); pidsGroup != "" && hs["pids"].Mount != "" {
		// The launcher could not remove it: terraformer does, after the command.
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(hs["pids"].Mount, pidsGroup))
			return errors.Is(err, os.ErrNotExist)
		}, "cgroup %s left after the launcher's kill", pidsGroup)
	}
	t.Logf("job after the launcher's kill: %v", j.Err())
	if !alive(strconv.Itoa(p.cmd.Process.Pid)) {
		t.Fatal("terraformer died with the launcher")
	}
}

// children returns the pids of pid's children whose environment holds env (NAME=value).
func children(pid int, env string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, ent := range entries {
		child, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue
		}
		_, rest, _ := strings.Cut(string(stat), ") ")
		fields := strings.Fields(rest) // state ppid ...
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		environ, _ := os.ReadFile("/proc/" + ent.Name() + "/environ")
		if bytes.Contains(append([]byte{0}, append(environ, 0)...), []byte("\x00"+env+"\x00")) {
			out = append(out, child)
		}
	}
	return out
}
