package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
)

// TestLimitsFromTheCLI (issue 19 §1): an administrator's `template update --max-machines` caps a
// template's stacks (a member may not set it; `template get` shows it), `stack plan` above the
// cap says the limit; and `stack plan` of a plan that outlasts the CLI's usual 30 s call
// timeout gets kloud's answer (the plan timeout) instead of "no response to stack.plan:
// timeout" while terraform goes on, and leaves no terraform running.
func TestLimitsFromTheCLI(t *testing.T) {
	t.Parallel()
	testutil.RequireBinary(t, "curl")
	reg := provider.NewRegistry()
	machines := filepath.Join(t.TempDir(), "machines")
	reg.Register(dummy.New(dummy.Options{Dir: machines}))
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg, Limits: kloud.Limits{PlanTimeout: 35 * time.Second}})
	tfDir := filepath.Join(t.TempDir(), "terraformer")
	e.StartTerraformerWith(tfrun.Options{Dir: tfDir})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	alice := func(args ...string) (int, string, string) { return run(append(args, "--key", aliceKey)...) }
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))
	if _, err := e.Client("alice").CredentialAdd(t.Context(), api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"s3cret-token"}`)}); err != nil {
		t.Fatal(err)
	}
	template := func(title, main string) string {
		t.Helper()
		p := filepath.Join(t.TempDir(), "main.tf")
		if err := os.WriteFile(p, []byte(main), 0o600); err != nil {
			t.Fatal(err)
		}
		var tp struct{ ID string }
		if err := json.Unmarshal([]byte(must(alice("template", "create", "--title", title, "--file", p, "--json"))), &tp); err != nil || tp.ID == "" {
			t.Fatalf("template create: %+v %v", tp, err)
		}
		return tp.ID
	}
	fails := func(what string, code int, stdout, stderr string, want ...string) {
		t.Helper()
		if code == 0 {
			t.Fatalf("%s: exit 0\n%s", what, stdout)
		}
		for _, w := range want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: stderr does not say %q:\n%s", what, w, stderr)
			}
		}
		t.Logf("%s: %s", what, strings.TrimSpace(stderr))
	}

	two := template("two", "resource \"terraform_data\" \"vm\" {\n  count = 2\n}\n")
	code, out, errOut := alice("template", "update", two, "--max-machines", "1")
	fails("a member's template update --max-machines", code, out, errOut, "only a kloud owner or template admin")
	out = must(run("template", "update", two, "--max-machines", "1"))
	if !strings.Contains(out, "machine cap: 1 per stack") {
		t.Errorf("template update --max-machines 1:\n%s", out)
	}
	if out := must(alice("template", "get", two)); !strings.Contains(out, "machine cap: 1 per stack") {
		t.Errorf("template get does not show the cap:\n%s", out)
	}
	code, out, errOut = alice("stack", "plan", "--template", two)
	fails("stack plan above the template's cap", code, out, errOut, "asks for 2 machines", "the limit is 1 machine per stack", "--max-machines N")

	big := template("big", "resource \"terraform_data\" \"vm\" {\n  count = max(100000, 1)\n}\n")
	start := time.Now()
	code, out, errOut = alice("stack", "plan", "--template", big)
	fails("stack plan of 100000 machines", code, out, errOut, "plan timeout", "--plan-timeout")
	if strings.Contains(errOut, "no response to stack.plan") {
		t.Errorf("the CLI gave up before kloud answered (after %s)", time.Since(start).Round(time.Second))
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, tfDir)
}

// TestRateLimitFromTheCLI: once alice has used her burst of calls, her commands fail saying
// "rate limited: retry in Ns" and naming the flags (the refill, 1000 s, is longer than the CLI
// waits), exit non-zero, and the administrator's commands still work. Under a limit that refills
// in a moment (TestRateLimitCLIWaits) the CLI waits instead.
func TestRateLimitFromTheCLI(t *testing.T) {
	t.Parallel()
	_, run, must := startKloud(t, kloudtest.Options{Limits: kloud.Limits{RateLimit: 0.001, RateBurst: 10}})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))
	var code int
	var errOut string
	for i := 0; i < 20; i++ {
		if code, _, errOut = run("stack", "list", "--key", aliceKey); code != 0 {
			break
		}
	}
	if code == 0 {
		t.Fatal("20 stack lists in a row under a burst of 10: none refused")
	}
	for _, want := range []string{"rate limited: retry in ", "--rate-limit"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut)
		}
	}
	t.Logf("refused: %s", strings.TrimSpace(errOut))
	must(run("user", "list"))
}

// TestRateLimitCLIWaits: a script that calls the CLI in a loop faster than alice's limit (2
// calls a second, 2 at once) is slowed down, not failed: each refused call waits the retry time
// kloud names and goes again, so all 8 commands succeed, and take at least the 3 s the limit
// allows them (the assertion is the limit's, not a timing of ours).
func TestRateLimitCLIWaits(t *testing.T) {
	t.Parallel()
	_, run, must := startKloud(t, kloudtest.Options{Limits: kloud.Limits{RateLimit: 2, RateBurst: 2}})
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	must(run("key", "create", "--username", "alice", "--out", aliceKey))
	start := time.Now()
	for i := range 8 {
		if code, out, errOut := run("stack", "list", "--key", aliceKey); code != 0 {
			t.Fatalf("stack list %d of 8 under 2 calls a second: exit %d\n%s%s", i+1, code, out, errOut)
		}
	}
	if d := time.Since(start); d < 3*time.Second {
		t.Fatalf("8 calls under 2 a second with a burst of 2 took %s: the limit did not hold", d)
	}
}

// TestPlanInterruptCancels: `kloud stack plan` of a 100,000-machine plan shows the job's progress
// on stderr; Ctrl-C (its context ends) cancels the plan job, which stops terraform: the command
// says so, the job ends cancelled and no terraform is left running.
func TestPlanInterruptCancels(t *testing.T) {
	t.Parallel()
	testutil.RequireBinary(t, "curl")
	reg := provider.NewRegistry()
	reg.Register(dummy.New(dummy.Options{Dir: filepath.Join(t.TempDir(), "machines")}))
	dataDir := t.TempDir()
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg, DataDir: dataDir})
	tfDir := filepath.Join(t.TempDir(), "terraformer")
	e.StartTerraformerWith(tfrun.Options{Dir: tfDir})
	must(run("user", "add", "alice", "--team", model.DefaultTeam))
	alice := e.Client("alice")
	if _, err := alice.CredentialAdd(t.Context(), api.CredentialAddParams{Provider: "dummy", Title: "mine", Data: json.RawMessage(`{"token":"s3cret-token"}`)}); err != nil {
		t.Fatal(err)
	}
	tp, err := alice.TemplateCreate(t.Context(), api.TemplateParams{Title: "big", Files: map[string]string{"main.tf": "resource \"terraform_data\" \"vm\" {\n  count = max(100000, 1)\n}\n"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, interrupt := context.WithCancel(t.Context())
	defer interrupt()
	var out bytes.Buffer   // read once Run has returned
	var errOut cli.SyncBuf // read while Run writes
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"stack", "plan", "--template", tp.ID, "--url", e.URL, "--data-dir", dataDir}, &out, &errOut)
	}()
	// terraform plans: a running terraformer job, whose progress the CLI has shown (on a loaded
	// machine the CLI's poll may come after terraform started).
	testutil.Eventually(t, time.Minute, func() bool {
		paths, _ := filepath.Glob(filepath.Join(tfDir, "jobs", "*.json"))
		for _, p := range paths {
			b, _ := os.ReadFile(p)
			var j tfapi.Job
			if json.Unmarshal(b, &j) == nil && j.Status == tfapi.StatusRunning {
				return strings.Contains(errOut.String(), "Planning")
			}
		}
		return false
	}, "terraform never started planning, or the CLI never said so:\n%s", &errOut)
	interrupt()
	var code int
	select {
	case code = <-done:
	case <-time.After(time.Minute):
		t.Fatal("stack plan did not end after the interrupt")
	}
	t.Logf("exit %d, stderr:\n%s", code, errOut.String())
	if code == 0 || !strings.Contains(errOut.String(), "plan cancelled") {
		t.Errorf("interrupted stack plan: exit %d, stderr:\n%s", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "Planning") {
		t.Errorf("stderr shows no progress of the plan job:\n%s", errOut.String())
	}
	jobs, err := e.Client(kloud.Admin).JobList(t.Context(), api.JobListParams{Target: "template/" + tp.ID})
	if err != nil || len(jobs.Jobs) != 1 {
		t.Fatalf("plan jobs: %+v %v", jobs, err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		j, err := e.Client(kloud.Admin).JobGet(t.Context(), api.JobRef{JobID: jobs.Jobs[0].ID})
		return err == nil && j.Status == api.JobCancelled
	}, "the plan job did not end cancelled")
	tfruntest.AssertNoProcesses(t, 30*time.Second, tfDir)
}
