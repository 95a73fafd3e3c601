package terraformer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfclient"
	"github.com/kloud-dev/kloud/terraformer/tfpool"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// counted is a stack whose two fast resources each append a line to <dir>/created.log when they
// are created (so a resource created twice shows), then a slow one that runs cmd.
func counted(dir, cmd string) string {
	return `
resource "terraform_data" "fast" {
  count = 2
  input = "fast-${count.index}"
  provisioner "local-exec" {
    command = "echo fast-${count.index} >> ` + dir + `/created.log"
  }
}
resource "terraform_data" "slow" {
  depends_on = [terraform_data.fast]
  input      = "slow"
  provisioner "local-exec" {
    command = "` + strings.ReplaceAll(cmd, `"`, `\"`) + `"
  }
}
output "slow" { value = terraform_data.slow.output }
`
}

// newPool is a pool over clients of the terraformers at urls, as kloud makes it.
func newPool(t *testing.T, keys *terraformertest.Keys, urls ...string) *tfpool.Pool {
	t.Helper()
	var cs []*tfclient.Client
	for _, u := range urls {
		cs = append(cs, terraformertest.NewClient(t, tfclient.KiteURL(u), keys.KiteKeyAuth("kloud")))
	}
	p, err := tfpool.New(tfpool.Options{Members: cs, CheckInterval: 500 * time.Millisecond, FailoverAfter: 2 * time.Second, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestPool runs two real terraformer processes on one --shared-dir behind a tfpool.Pool: runs land
// on both; a second apply of a stack that one of them is applying is refused with ErrConflict
// wherever it lands (the stack's lease in the shared directory); SIGKILL of the terraformer
// running the apply ends the job with KindRestarted as the other one reads it, the apply run
// again through the pool lands on the survivor and completes without creating anything twice;
// the state, and a destroy without files, work with the first terraformer gone. A terraformer
// with a directory of its own is refused by a pool.
func TestPool(t *testing.T) {
	t.Parallel()
	keys := terraformertest.StartKeys(t)
	shared := t.TempDir()
	a := startProcArgs(t, keys, "--shared-dir", shared, "--lease-ttl", "5s")
	b := startProcArgs(t, keys, "--shared-dir", shared, "--lease-ttl", "5s")
	pool := newPool(t, keys, a.url(), b.url())
	ctx := t.Context()
	pidOf := map[int]string{a.cmd.Process.Pid: "a", b.cmd.Process.Pid: "b"}

	// 0. A member of another directory is never used.
	lone := startProcArgs(t, keys, "--lease-ttl", "5s")
	mixed := newPool(t, keys, a.url(), lone.url())
	testutil.Eventually(t, 30*time.Second, func() bool {
		ms := mixed.Members()
		return ms[0].Live && !ms[1].Live && strings.Contains(ms[1].Error, "--shared-dir")
	}, "a pool used a terraformer of another directory: %+v", mixed.Members())

	// 1. Runs land on both.
	on := map[string]bool{}
	for i := range 4 {
		id, err := pool.Plan(ctx, tfapi.Request{ContentID: "spread-" + string(rune('a'+i)), Files: files(`resource "terraform_data" "x" {}`)})
		if err != nil {
			t.Fatal(err)
		}
		j, err := pool.Wait(ctx, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		on[pidOf[j.PID]] = true
	}
	if !on["a"] || !on["b"] {
		t.Fatalf("four plans ran on %v, want both terraformers", on)
	}

	// 2. One apply of a stack at a time, whichever member a second one lands on.
	work := filepath.Join(shared, "stacks", "takeover", "work")
	releaseAtEnd(t, work)
	req := tfapi.Request{ContentID: "takeover", Files: files(counted(work, pollGateCmd(work)))}
	id, err := pool.Apply(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(work, "started"))
	running, err := pool.Job(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	victim, survivor := a, b
	if pidOf[running.PID] == "b" {
		victim, survivor = b, a
	}
	if _, err := pool.Apply(ctx, req); !errors.Is(err, kite.ErrConflict) {
		t.Fatalf("a second apply through the pool of a stack being applied: %v, want ErrConflict", err)
	}
	for _, p := range []*proc{a, b} { // straight to each member: both refuse
		c := terraformertest.NewClient(t, tfclient.KiteURL(p.url()), keys.KiteKeyAuth("kloud"))
		if _, err := c.Apply(ctx, req); !errors.Is(err, kite.ErrConflict) {
			t.Fatalf("a second apply on terraformer %s of a stack being applied: %v, want ErrConflict", pidOf[p.cmd.Process.Pid], err)
		}
	}

	// 3. SIGKILL of the member running the apply: the job ends as the survivor reads it.
	waited := make(chan error, 1)
	var final *tfapi.Job
	go func() {
		var err error
		final, err = pool.Wait(ctx, id, nil)
		waited <- err
	}()
	killed := time.Now()
	victim.signal(syscall.SIGKILL)
	tfruntest.AssertNoProcesses(t, 30*time.Second, work)
	select {
	case err = <-waited:
	case <-time.After(2 * time.Minute):
		t.Fatal("Wait did not end after its terraformer was killed")
	}
	var je *tfapi.JobError
	if !errors.As(err, &je) || je.Kind != tfapi.KindRestarted || final == nil || final.Status != tfapi.StatusFailed {
		t.Fatalf("Wait of the killed run: %v (%+v), want a job failed with kind %s", err, final, tfapi.KindRestarted)
	}
	t.Logf("the killed run was final on the survivor %s after the kill", time.Since(killed).Round(time.Millisecond))

	// The run again, as stackbuild does after RunDied: on the survivor, to the end.
	os.Remove(filepath.Join(work, "started"))
	release(t, work)
	id, err = pool.Apply(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	j, err := pool.Wait(ctx, id, nil)
	if err != nil {
		t.Fatalf("the apply run again: %v", err)
	}
	if j.PID != survivor.cmd.Process.Pid {
		t.Fatalf("the apply run again ran in pid %d, want the survivor %d", j.PID, survivor.cmd.Process.Pid)
	}
	if got := tfruntest.Addresses(j.Result.Resources); len(got) != 3 {
		t.Fatalf("resources after the takeover: %v", got)
	}
	b2, err := os.ReadFile(filepath.Join(work, "created.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b2))
	slices.Sort(lines)
	if !slices.Equal(lines, []string{"fast-0", "fast-1"}) {
		t.Fatalf("creations of the fast resources across the kill and the takeover: %q, want each once", lines)
	}

	// 4. The state, and a destroy with the stack's stored files, with the first member gone.
	st, err := pool.State(ctx, "takeover")
	if err != nil || st.Values == nil || len(st.Values.RootModule.Resources) != 3 {
		t.Fatalf("state through the pool after the kill: %+v %v", st, err)
	}
	id, err = pool.Destroy(ctx, tfapi.Request{ContentID: "takeover"})
	if err != nil {
		t.Fatal(err)
	}
	if j, err = pool.Wait(ctx, id, nil); err != nil || len(j.Result.Resources) != 0 {
		t.Fatalf("destroy on the survivor: %+v %v", j, err)
	}
	if ms := pool.Members(); ms[0].Live == ms[1].Live {
		t.Errorf("members after the kill: %+v, want one live", ms)
	}

	// 5. Both gone: calls fail at once as unavailable (kloud's callers wait for that).
	survivor.signal(syscall.SIGKILL)
	testutil.Eventually(t, 30*time.Second, func() bool { return pool.Unavailable() != nil }, "a pool with both members killed says it is available")
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := pool.Plan(cctx, tfapi.Request{ContentID: "x", Files: files(`resource "terraform_data" "x" {}`)}); !errors.Is(err, kite.ErrUnavailable) {
		t.Fatalf("plan with no member: %v, want unavailable", err)
	}
}
