package tfrun_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain doubles as a terraformer process for TestCrashRestart: with TFRUN_CRASH_CHILD=1 the test
// binary starts an engine, submits an apply, prints the job id and waits to be killed.
func TestMain(m *testing.M) {
	tfsandbox.MaybeRun()
	if os.Getenv("TFRUN_CRASH_CHILD") == "1" {
		os.Exit(crashChild())
	}
	code := m.Run()
	tfsandbox.RemoveTestLeftovers() // the groups of the runs its tests killed
	os.Exit(code)
}

func crashChild() int {
	ctx := context.Background()
	ttl, err := time.ParseDuration(os.Getenv("TFRUN_LEASE_TTL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	e, err := tfrun.New(ctx, tfrun.Options{
		Dir:           os.Getenv("TFRUN_DIR"),
		TerraformPath: os.Getenv("TFRUN_TERRAFORM"),
		CLIConfigFile: os.Getenv("TFRUN_CLI_CONFIG"),
		LeaseTTL:      ttl,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	main, err := os.ReadFile(os.Getenv("TFRUN_MAIN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	j, err := e.Submit(ctx, tfrun.Request{Op: tfrun.OpApply, ContentID: "crash", Files: files(string(main))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(j.ID)
	time.Sleep(time.Hour) // until the test kills us
	return 0
}

// TestCrashRestart SIGKILLs a terraformer (a child process running the engine) in the middle of an
// apply, then starts a new engine on the same Dir: the dead job is failed, the lease expires, the
// state the dead run wrote is intact, and the next apply converges.
func TestCrashRestart(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	tf, cfg := tfruntest.Setup(t)
	dir := t.TempDir()
	gateDir := filepath.Join(dir, "stacks", "crash", "work")
	t.Cleanup(func() { os.WriteFile(filepath.Join(gateDir, "release"), nil, 0o600) })
	mainPath := filepath.Join(t.TempDir(), "main.tf")
	if err := os.WriteFile(mainPath, []byte(fmt.Sprintf(stackWithGate, gate(gateDir))), 0o600); err != nil {
		t.Fatal(err)
	}
	// Long enough that the dead run's lease is still held when the new engine (whose start runs
	// terraform version through the sandbox: seconds on a loaded machine) first submits.
	const ttl = 20 * time.Second
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TFRUN_CRASH_CHILD=1", "TFRUN_DIR="+dir, "TFRUN_TERRAFORM="+tf,
		"TFRUN_CLI_CONFIG="+cfg, "TFRUN_MAIN="+mainPath, "TFRUN_LEASE_TTL="+ttl.String())
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	ids := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ids <- strings.TrimSpace(line)
	}()
	var jobID string
	select {
	case jobID = <-ids:
	case <-time.After(time.Minute):
		t.Fatal("child printed no job id")
	}
	if jobID == "" {
		t.Fatal("child failed to submit")
	}
	waitFile(t, filepath.Join(gateDir, "started")) // the fast resources are done, slow is creating

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	exited = true
	// Everything the killed terraformer's terraform started died with it: terraform, the
	// provider, the provisioner's shell (their pid namespace ended with the launcher).
	tfruntest.AssertNoProcesses(t, 30*time.Second, gateDir)

	e := tfruntest.NewEngine(t, tfrun.Options{Dir: dir, LeaseTTL: ttl})
	dead, err := e.Job(jobID)
	if err != nil {
		t.Fatal(err)
	}
	if dead.Status != tfrun.StatusFailed || dead.Error == nil || dead.Error.Kind != tfrun.KindRestarted {
		t.Fatalf("job of the killed terraformer: %s %+v", dead.Status, dead.Error)
	}
	// The dead process's lease has not expired yet, but its process on this host is gone: the
	// lease is free at once (issue 23: a run that died with its process is started again, not
	// after the lease's TTL). Another engine's live lease still locks (TestSameContentLocked).
	pj, err := e.Submit(t.Context(), tfrun.Request{Op: tfrun.OpPlan, ContentID: "crash"})
	if err != nil {
		t.Fatalf("plan right after the crash: %v, want the dead process's lease free", err)
	}
	if pj = tfruntest.Wait(t, e, pj.ID, jobTimeout); pj.Status != tfrun.StatusSucceeded {
		t.Fatalf("plan right after the crash: %s %v", pj.Status, pj.Err())
	}
	// State reads what the dead run wrote: the fast resources.
	var addrs []string
	testutil.Eventually(t, time.Minute, func() bool {
		st, err := e.State(t.Context(), "crash")
		if err != nil {
			return false
		}
		addrs = addrs[:0]
		for _, r := range st.Values.RootModule.Resources {
			addrs = append(addrs, r.Address)
		}
		return true
	}, "state of the crashed stack never became readable")
	if !slices.Contains(addrs, "terraform_data.fast[0]") || !slices.Contains(addrs, "terraform_data.fast[1]") {
		t.Fatalf("state after the crash: %v", addrs)
	}

	release(t, gateDir)
	next := run(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "crash"}, tfrun.StatusSucceeded)
	if got := tfruntest.Addresses(next.Result.Resources); len(got) != 3 {
		t.Fatalf("state after the converging apply: %v", got)
	}
	plan := run(t, e, tfrun.Request{Op: tfrun.OpPlan, ContentID: "crash"}, tfrun.StatusSucceeded)
	if len(plan.Result.Changes) != 0 {
		t.Errorf("plan after converging: %+v", plan.Result.Changes)
	}
}

func TestJobReadableAfterRestart(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	tf, cfg := tfruntest.Setup(t)
	dir := t.TempDir()
	opts := tfrun.Options{Dir: dir, TerraformPath: tf, CLIConfigFile: cfg, Logger: testutil.Logger(t)}
	e1, err := tfrun.New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	j := run(t, e1, tfrun.Request{Op: tfrun.OpApply, ContentID: "durable", Files: files(`
resource "terraform_data" "x" { input = "kept" }
output "x" { value = terraform_data.x.output }
`)}, tfrun.StatusSucceeded)
	if err := e1.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := e1.Submit(t.Context(), tfrun.Request{Op: tfrun.OpPlan, ContentID: "durable"}); !errors.Is(err, tfrun.ErrClosed) {
		t.Errorf("submit after close: %v, want ErrClosed", err)
	}

	e2 := tfruntest.NewEngine(t, tfrun.Options{Dir: dir})
	got, err := e2.Job(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != tfrun.StatusSucceeded || got.Result == nil || got.Result.Outputs["x"].Value != "kept" ||
		!slices.Equal(tfruntest.Addresses(got.Result.Resources), []string{"terraform_data.x"}) || len(got.Log) == 0 {
		t.Fatalf("job after restart: %+v", got)
	}
	ch, err := e2.Watch(t.Context(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-ch; ev.Type != tfrun.EventFinal || ev.Job.Status != tfrun.StatusSucceeded {
		t.Fatalf("watch after restart: %+v", ev)
	}
	if out, err := e2.Outputs(t.Context(), "durable"); err != nil || out["x"] != "kept" {
		t.Fatalf("outputs after restart: %v %v", out, err)
	}
	// The full terraform output is kept beside the job.
	if b, err := os.ReadFile(filepath.Join(dir, "jobs", j.ID+".log")); err != nil || !strings.Contains(string(b), `"type":"apply_complete"`) {
		t.Errorf("job log file: %v", err)
	}
}

func TestCloseCancelsRuns(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	tf, cfg := tfruntest.Setup(t)
	dir := t.TempDir()
	gateDir := filepath.Join(dir, "stacks", "closing", "work")
	e1, err := tfrun.New(t.Context(), tfrun.Options{Dir: dir, TerraformPath: tf, CLIConfigFile: cfg, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf(`echo $$ > %[1]s/pid; touch %[1]s/started; [ -f %[1]s/release ] || exec sleep 300`, gateDir)
	j := submit(t, e1, tfrun.Request{Op: tfrun.OpApply, ContentID: "closing", Files: files(fmt.Sprintf(stackWithGate, cmd))})
	waitFile(t, filepath.Join(gateDir, "started"))
	if err := e1.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, gateDir)

	e2 := tfruntest.NewEngine(t, tfrun.Options{Dir: dir})
	got, err := e2.Job(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != tfrun.StatusCancelled || got.Error.Kind != tfrun.KindClosing {
		t.Fatalf("job after close: %s %+v", got.Status, got.Error)
	}
	// Close released the lease: no waiting for it to expire.
	release(t, gateDir)
	run(t, e2, tfrun.Request{Op: tfrun.OpApply, ContentID: "closing"}, tfrun.StatusSucceeded)
}

// TestCancelEscalatesToSIGKILL uses a fake terraform that ignores SIGINT: Cancel must kill its
// whole process group, child included, after CancelGrace, and not before.
func TestCancelEscalatesToSIGKILL(t *testing.T) {
	t.Parallel()
	fake, err := filepath.Abs("testdata/fake-terraform-ignores-sigint.sh")
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "empty.tfrc")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	const grace = 300 * time.Millisecond
	dir := t.TempDir()
	e := tfruntest.NewEngine(t, tfrun.Options{Dir: dir, TerraformPath: fake, CLIConfigFile: cfg, CancelGrace: grace})
	j := submit(t, e, tfrun.Request{Op: tfrun.OpApply, ContentID: "wedged", Files: files("# fake")})
	testutil.Eventually(t, time.Minute, func() bool {
		got, err := e.Job(j.ID)
		return err == nil && slices.Contains(got.Log, "fake terraform: ignoring SIGINT")
	}, "fake terraform never started ignoring SIGINT")

	cancelAt := time.Now()
	if err := e.Cancel(t.Context(), j.ID); err != nil {
		t.Fatal(err)
	}
	got, err := e.Job(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != tfrun.StatusCancelled {
		t.Fatalf("status %s: %v", got.Status, got.Err())
	}
	if d := got.FinishedAt.Sub(cancelAt); d < grace {
		t.Errorf("job ended %s after cancel, before the %s grace: SIGKILL came too early", d, grace)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, filepath.Join(dir, "stacks", "wedged", "work"))
}
