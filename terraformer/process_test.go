package terraformer_test

import (
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/terraformertest"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// proc runs the real cmd/terraformer binary on a fixed loopback address and data dir, so that a
// restart comes back where the old process was.
type proc struct {
	t    *testing.T
	bin  string
	addr string
	dir  string // --data-dir
	args []string
	cmd  *exec.Cmd
}

func startProc(t *testing.T, keys *terraformertest.Keys, leaseTTL time.Duration) *proc {
	t.Helper()
	return startProcArgs(t, keys, "--lease-ttl", leaseTTL.String())
}

// startProcArgs is startProc with more flags.
func startProcArgs(t *testing.T, keys *terraformertest.Keys, extra ...string) *proc {
	t.Helper()
	tf, cfg := tfruntest.Setup(t)
	bin := testutil.BuildBinary(t, "./cmd/terraformer")
	p := &proc{t: t, bin: bin, addr: testutil.FreeLoopback(t), dir: t.TempDir()}
	p.args = append([]string{"--addr", p.addr, "--data-dir", p.dir, "--kloud-url", keys.URL,
		"--terraform", tf, "--cli-config", cfg, "--cancel-grace", "20s"}, extra...)
	p.start()
	return p
}

func (p *proc) url() string { return "http://" + p.addr }

// workDir is the Terraform working directory of contentID: the only host directory its
// sandboxed terraform can write, so the gates are there.
func (p *proc) workDir(contentID string) string {
	return filepath.Join(p.dir, "stacks", contentID, "work")
}

func (p *proc) start() {
	p.t.Helper()
	p.cmd = testutil.StartProcess(p.t, p.bin, p.args...)
	testutil.Eventually(p.t, time.Minute, func() bool {
		resp, err := http.Get(p.url() + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "terraformer at %s never became healthy", p.addr)
}

// signal sends sig and waits until the process has exited.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
	pid := strconv.Itoa(p.cmd.Process.Pid)
	testutil.Eventually(p.t, time.Minute, func() bool { return !alive(pid) }, "terraformer %s did not exit on %s", pid, sig)
}

// TestKilledProcessRestarts SIGKILLs a real terraformer process in the middle of an apply and
// starts it again on the same data dir: the dead job reads as failed, the dead process's lease
// is free at once (its pid on this host is gone), the state the killed run wrote is intact, and
// the next apply converges. The client kloud uses reconnects by itself across the restart.
func TestKilledProcessRestarts(t *testing.T) {
	t.Parallel()
	keys := terraformertest.StartKeys(t)
	const ttl = 5 * time.Second
	p := startProc(t, keys, ttl)
	c := terraformertest.NewClient(t, p.url(), keys.KiteKeyAuth("kloud"))
	gate := p.workDir("crash")
	releaseAtEnd(t, gate)
	id := submit(t, c, tfrun.OpApply, terraformer.Request{ContentID: "crash", Files: files(gated(pollGateCmd(gate)))})
	waitFile(t, filepath.Join(gate, "started")) // the fast resources are done, slow is creating

	p.signal(syscall.SIGKILL)
	// terraform, its provider and the provisioner died with the process (their pid namespace).
	tfruntest.AssertNoProcesses(t, 30*time.Second, gate)
	p.start()

	j, err := c.Job(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != tfrun.StatusFailed || j.Error == nil || j.Error.Kind != tfrun.KindRestarted {
		t.Fatalf("job of the killed terraformer: %s %+v", j.Status, j.Error)
	}
	// The dead process's lease has not expired, but its process on this host is gone: the
	// content is free at once (issue 23), a plan runs right away...
	if plan := run(t, c, tfrun.OpPlan, terraformer.Request{ContentID: "crash"}, tfrun.StatusSucceeded); plan.Result == nil {
		t.Fatalf("plan right after the restart: %+v", plan)
	}
	// ...and the state the killed run wrote can be read.
	var addrs []string
	testutil.Eventually(t, time.Minute, func() bool {
		st, err := c.State(t.Context(), "crash")
		if err != nil || st.Values == nil {
			return false
		}
		addrs = addrs[:0]
		for _, r := range st.Values.RootModule.Resources {
			addrs = append(addrs, r.Address)
		}
		return true
	}, "the state of the killed run never became readable")
	if !slices.Contains(addrs, "terraform_data.fast[0]") || !slices.Contains(addrs, "terraform_data.fast[1]") {
		t.Fatalf("state after the crash: %v", addrs)
	}

	// The next apply converges.
	release(t, gate)
	next := run(t, c, tfrun.OpApply, terraformer.Request{ContentID: "crash"}, tfrun.StatusSucceeded)
	if got := tfruntest.Addresses(next.Result.Resources); len(got) != 3 {
		t.Fatalf("state after the converging apply: %v", got)
	}
	if plan := run(t, c, tfrun.OpPlan, terraformer.Request{ContentID: "crash"}, tfrun.StatusSucceeded); len(plan.Result.Changes) != 0 {
		t.Errorf("plan after converging: %+v", plan.Result.Changes)
	}
	if c.Connects() < 2 {
		t.Errorf("client connected %d times across a restart", c.Connects())
	}
}

// TestGracefulShutdown stops a real terraformer with SIGINT mid-apply: the run is cancelled
// (terraform gets SIGINT and saves the state), a watcher learns it, the lease is released at once
// (the restarted process takes the content id without waiting for a TTL of an hour), and the job
// reads as cancelled after the restart.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	keys := terraformertest.StartKeys(t)
	p := startProc(t, keys, time.Hour)
	c := terraformertest.NewClient(t, p.url(), keys.KiteKeyAuth("kloud"))
	gate := p.workDir("shutdown")
	releaseAtEnd(t, gate)
	id := submit(t, c, tfrun.OpApply, terraformer.Request{ContentID: "shutdown", Files: files(gated(gateCmd(gate)))})
	waitFile(t, filepath.Join(gate, "started"))

	watching := make(chan struct{})
	type result struct {
		j   *tfrun.Job
		err error
	}
	done := make(chan result, 1)
	go func() {
		first := true
		j, err := c.Wait(t.Context(), id, func(ev terraformer.Event) {
			if first {
				first = false
				close(watching)
			}
		})
		done <- result{j, err}
	}()
	<-watching
	p.signal(syscall.SIGINT)
	r := <-done
	if r.j == nil || r.j.Status != tfrun.StatusCancelled || r.j.Error.Kind != tfrun.KindClosing {
		t.Fatalf("watcher at shutdown: %+v %v", r.j, r.err)
	}
	if got := tfruntest.Addresses(r.j.Result.Resources); !slices.Contains(got, "terraform_data.fast[0]") {
		t.Errorf("state saved at shutdown: %v", got)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, gate)

	p.start()
	release(t, gate)
	next := run(t, c, tfrun.OpApply, terraformer.Request{ContentID: "shutdown"}, tfrun.StatusSucceeded)
	if got := tfruntest.Addresses(next.Result.Resources); len(got) != 3 {
		t.Errorf("after restart: %v", got)
	}
	if j, err := c.Job(t.Context(), id); err != nil || j.Status != tfrun.StatusCancelled {
		t.Errorf("cancelled job after restart: %+v %v", j, err)
	}
}
