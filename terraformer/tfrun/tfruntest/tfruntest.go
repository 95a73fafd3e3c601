// Package tfruntest gives tests a real terraform binary and an offline provider mirror (the results
// of scripts/tf-mirror.sh), and engines that clean up after themselves. Start with Setup.
package tfruntest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// LocalProviderVersion is the hashicorp/local provider version the mirror holds.
const LocalProviderVersion = "1.4.0"

// Cache returns $KLOUD_CACHE, default /var/cache/kloud.
func Cache() string {
	if c := os.Getenv("KLOUD_CACHE"); c != "" {
		return c
	}
	return "/var/cache/kloud"
}

// Setup returns the terraform binary and the CLI config file (TF_CLI_CONFIG_FILE) whose filesystem
// mirror holds hashicorp/local LocalProviderVersion. The binary is $KLOUD_TERRAFORM if set (to run
// the tests against another terraform, such as the v1.5.7 that tf-mirror.sh --build-terraform
// builds), else terraform on PATH, else $KLOUD_CACHE/bin/terraform.
//
// When the mirror is missing the test is skipped loudly, except under CI=true, where Setup runs
// scripts/tf-mirror.sh (idempotent, locked against concurrent runs) and fails the test if that fails.
func Setup(t testing.TB) (terraformPath, cliConfig string) {
	t.Helper()
	cache := Cache()
	cliConfig = filepath.Join(cache, "terraform.tfrc")
	provider := filepath.Join(cache, "tf-mirror", "registry.terraform.io", "hashicorp", "local", LocalProviderVersion,
		runtime.GOOS+"_"+runtime.GOARCH, "terraform-provider-local_v"+LocalProviderVersion)
	terraformPath = findTerraform(cache)
	if terraformPath != "" && exists(cliConfig) && exists(provider) {
		return terraformPath, cliConfig
	}
	if !testutil.InCI() {
		testutil.Unavailable(t, "terraform and the offline provider mirror under %s (run scripts/tf-mirror.sh)", cache)
	}
	script, err := findScript()
	if err != nil {
		t.Fatalf("REQUIRED UNDER CI=true: terraform provider mirror: %v", err)
	}
	t.Logf("running %s (KLOUD_CACHE=%s)", script, cache)
	var out, errOut bytes.Buffer
	cmd := exec.Command("bash", script)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("REQUIRED UNDER CI=true: %s: %v\n%s", script, err, errOut.String())
	}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "TERRAFORM="); ok && os.Getenv("KLOUD_TERRAFORM") == "" {
			terraformPath = p
		}
	}
	if terraformPath == "" || !exists(cliConfig) || !exists(provider) {
		t.Fatalf("REQUIRED UNDER CI=true: %s ran but terraform=%q, %s or %s is missing", script, terraformPath, cliConfig, provider)
	}
	return terraformPath, cliConfig
}

func findTerraform(cache string) string {
	if p := os.Getenv("KLOUD_TERRAFORM"); p != "" {
		if exists(p) {
			return p
		}
		return ""
	}
	if p, err := exec.LookPath("terraform"); err == nil {
		return p
	}
	if p := filepath.Join(cache, "bin", "terraform"); exists(p) {
		return p
	}
	return ""
}

// findScript walks up from the working directory (a test runs in its package directory) to the
// repository's scripts/tf-mirror.sh.
func findScript() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "scripts", "tf-mirror.sh")
		if exists(p) {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// NewEngine starts an engine on a temporary Dir (unless opts.Dir is set) with Setup's terraform and
// mirror (unless set) and a logger writing to t.Log, and closes it when the test ends. The
// sandbox launcher is the terraformer binary (testutil.BuildBinary), unless opts.Launcher is set;
// a test binary that sets it to itself must call tfsandbox.MaybeRun() first in TestMain. Without root
// (the sandbox needs it) the test is skipped loudly, unless opts.InsecureNoSandbox; under CI=true
// it fails.
func NewEngine(t testing.TB, opts tfrun.Options) *tfrun.Engine {
	t.Helper()
	if !opts.InsecureNoSandbox {
		testutil.RequireRoot(t)
	}
	if opts.TerraformPath == "" || opts.CLIConfigFile == "" {
		tf, cfg := Setup(t)
		if opts.TerraformPath == "" {
			opts.TerraformPath = tf
		}
		if opts.CLIConfigFile == "" {
			opts.CLIConfigFile = cfg
		}
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = testutil.Logger(t)
	}
	if opts.Launcher == "" && !opts.InsecureNoSandbox {
		// The terraformer binary is the sandbox's launcher, as in production: the race-built test
		// binary, re-executed as launcher and init, cost about 75 ms of CPU twice per terraform
		// command (its size and the race runtime's start), terraformer's about 5 ms.
		opts.Launcher = testutil.BuildBinary(t, "./cmd/terraformer")
	}
	e, err := tfrun.New(context.Background(), opts)
	if err != nil {
		t.Fatalf("tfrun.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("close engine: %v", err)
		}
	})
	return e
}

// Wait watches the job until it finishes and returns the final job. It fails the test after timeout.
func Wait(t testing.TB, e *tfrun.Engine, id string, timeout time.Duration) *tfrun.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ch, err := e.Watch(ctx, id)
	if err != nil {
		t.Fatalf("watch %s: %v", id, err)
	}
	for ev := range ch {
		if ev.Type == tfrun.EventFinal {
			return ev.Job
		}
	}
	j, _ := e.Job(id)
	if j != nil {
		t.Fatalf("job %s did not finish within %s: status %s, log tail:\n%s", id, timeout, j.Status, strings.Join(j.Log, "\n"))
	}
	t.Fatalf("job %s did not finish within %s", id, timeout)
	return nil
}

// Addresses lists the addresses of rs, in order.
func Addresses(rs []tfrun.StateResource) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Address)
	}
	return out
}

// WorkDir is the Terraform working directory of contentID in the engine's Dir. A template's
// relative paths (path.module, a provisioner's cwd) are there; it is the only host directory a
// sandboxed terraform can write besides its private /tmp.
func WorkDir(e *tfrun.Engine, contentID string) string {
	return filepath.Join(e.Options().Dir, "stacks", contentID, "work")
}

// Process is a process found by Processes.
type Process struct {
	PID     int
	Exe     string
	Cwd     string
	Cmdline string
}

// Processes lists the live processes (zombies excluded) whose working directory, executable or
// command line is under one of dirs. It reads /proc; a sandboxed process shows its cwd as it sees
// it, which is the host path (the work dir is bound at its own path).
func Processes(dirs ...string) []Process {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	under := func(p string) bool {
		for _, d := range dirs {
			if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
				return true
			}
		}
		return false
	}
	var out []Process
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		base := "/proc/" + ent.Name()
		stat, err := os.ReadFile(base + "/stat")
		if err != nil {
			continue
		}
		if _, rest, _ := strings.Cut(string(stat), ") "); strings.HasPrefix(rest, "Z") || strings.HasPrefix(rest, "X") {
			continue
		}
		p := Process{PID: pid}
		p.Exe, _ = os.Readlink(base + "/exe")
		p.Cwd, _ = os.Readlink(base + "/cwd")
		cmdline, _ := os.ReadFile(base + "/cmdline")
		p.Cmdline = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
		match := under(p.Exe) || under(p.Cwd)
		for _, arg := range strings.Split(string(cmdline), "\x00") {
			match = match || (arg != "" && under(arg))
			for _, d := range dirs {
				match = match || (d != "" && strings.Contains(arg, d))
			}
		}
		if match {
			out = append(out, p)
		}
	}
	return out
}

// AssertNoProcesses waits up to timeout until no process works under dirs (see Processes), and
// fails the test naming those still there. The tests give 30s: what they check is that nothing
// is left, and a pid namespace's teardown (its processes killed and reaped) took more than 5s on
// a loaded 2-core host (CI).
func AssertNoProcesses(t testing.TB, timeout time.Duration, dirs ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := Processes(dirs...)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, p := range left {
				fmt.Fprintf(&b, "\n  pid %d exe %s cwd %s: %s", p.PID, p.Exe, p.Cwd, p.Cmdline)
			}
			t.Fatalf("%d processes still running under %v after %s:%s", len(left), dirs, timeout, b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
