package e2e

// Set-up shared by the provider tests (local, docker, vagrant and the dummy provider's): a kloud
// with a terraformer process of its own, the machines of a stack, and SIGKILL of kloud in the
// middle of a build with the checks of what a resumed build must leave.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// newTerraformerEnv starts a terraformer of its own on a free port (a process apart from kloud,
// so it survives a SIGKILL of kloud; the terraformer kloud serve starts by itself always takes
// 127.0.0.1:7001), running terraform with the Terraform CLI config cliConfig ("": terraform's
// default) for a kloud at addr (host:port); then that kloud, with extra flags. Both stop when
// the test ends, kloud first.
func newTerraformerEnv(t *testing.T, addr, cliConfig string, extra ...string) *env {
	t.Helper()
	tf := testutil.RequireBinary(t, "terraform")
	dir := t.TempDir()
	tfAddr := testutil.FreeLoopback(t)
	args := []string{"--addr", tfAddr, "--data-dir", filepath.Join(dir, "terraformer"), "--kloud-url", "http://" + addr, "--terraform", tf}
	if cliConfig != "" {
		args = append(args, "--cli-config", cliConfig)
	}
	testutil.StartProcess(t, filepath.Join(bin, "terraformer"), args...)
	e := &env{t: t, dir: dir, addr: addr, extra: append([]string{"--terraformer-url", "http://" + tfAddr}, extra...)}
	e.start()
	t.Cleanup(e.cleanup)
	return e
}

// machine is a machine as `kloud machine list --json` shows it, with its Terraform attributes.
type machine struct {
	ID, Label, State, Reason, KiteID, IPAddress string
	Agent                                       struct{ Status string }
	Attributes                                  map[string]any
}

// machines is `kloud machine list --stack STACK` by label.
func (e *env) machines(stack string) map[string]machine {
	var ms []machine
	e.runJSON(&ms, "machine", "list", "--stack", stack)
	out := map[string]machine{}
	for _, m := range ms {
		out[m.Label] = m
	}
	return out
}

// createStack creates a stack of template tid and returns its id.
func (e *env) createStack(tid string) string {
	var created struct{ Stack struct{ ID string } }
	e.runJSON(&created, "stack", "create", "--template", tid)
	return created.Stack.ID
}

// apply builds stack sid through the CLI (following the job) and fails the test unless it
// finished; it returns what the CLI printed.
func (e *env) apply(sid string) string {
	e.t.Helper()
	out := e.run("stack", "apply", sid)
	if !strings.Contains(out, "Stack building finished") {
		e.t.Fatalf("apply of stack %s:\n%s", sid, out)
	}
	return out
}

// resumedJob is what a build job ended as.
type resumedJob struct{ Status, Error string }

// killMidBuild applies stack sid detached, SIGKILLs kloud once the build job has reached
// percent (within timeout; it fails the test if the job ends first), starts kloud again and
// follows the job to its end. It returns the job's id and how it ended.
func (e *env) killMidBuild(sid string, percent int, timeout time.Duration) (jobID string, j resumedJob) {
	e.t.Helper()
	out := e.run("stack", "apply", sid, "--detach")
	jobID = strings.Fields(strings.TrimPrefix(out, "job "))[0]
	return jobID, e.killAt(jobID, percent, timeout, "the build")
}

// killAt SIGKILLs kloud once job jobID has reached percent (within timeout; a job that ends
// first fails the test, what names it), starts kloud again and follows the job to its end.
func (e *env) killAt(jobID string, percent int, timeout time.Duration, what string) (j resumedJob) {
	t := e.t
	t.Helper()
	var seen int
	testutil.Eventually(t, timeout, func() bool {
		var j struct {
			Percentage int
			Status     string
		}
		o, err := e.try("job", "get", jobID)
		if err != nil || json.Unmarshal([]byte(o), &j) != nil {
			return false
		}
		seen = j.Percentage
		if j.Status != "running" && j.Status != "queued" && j.Status != "" {
			t.Fatalf("%s: job %s ended (%s) before kloud could be killed at %d%%", what, jobID, j.Status, percent)
		}
		return j.Percentage >= percent
	}, "%s: job %s did not reach %d%%", what, jobID, percent)
	e.kill()
	t.Logf("%s: killed kloud at %d%%", what, seen)
	e.start()
	final, err := e.try("job", "watch", jobID)
	t.Logf("%s: the job after the restart (err %v):\n%s", what, err, final)
	e.runJSON(&j, "job", "get", jobID)
	return j
}

// checkResumedBuild checks stack sid of n machines after killMidBuild's job j: built, every
// machine Running with its agent connected and the stack Initialized; or failed saying why (the
// job and the stack), no machine left Building, every machine that is not Running with a reason.
func (e *env) checkResumedBuild(sid string, n int, j resumedJob) {
	t := e.t
	t.Helper()
	var st struct{ State, Reason string }
	e.runJSON(&st, "stack", "describe", sid)
	ms := e.machines(sid)
	if len(ms) != n {
		t.Fatalf("%d machines, want %d: %+v", len(ms), n, ms)
	}
	switch j.Status {
	case "succeeded":
		if st.State != "Initialized" {
			t.Errorf("stack after a successful resume: %+v", st)
		}
		for l, m := range ms {
			if m.State != "Running" || m.Agent.Status != "connected" {
				t.Errorf("%s after the resumed build: %+v", l, m)
			}
		}
	case "failed":
		if j.Error == "" || st.Reason == "" || st.State == "Building" {
			t.Errorf("a failed build must say why: job %+v, stack %+v", j, st)
		}
		for l, m := range ms {
			if m.State == "Building" || (m.State != "Running" && m.Reason == "") {
				t.Errorf("%s after the failed build: %+v", l, m)
			}
		}
	default:
		t.Fatalf("job after the restart: %+v", j)
	}
	t.Logf("job %s %s; stack %+v", j.Status, j.Error, st)
}

// stopStartKeepsFile writes a random word into /root/kept of machine label of stack sid (with
// exec, which runs a command in it), stops it through the CLI, runs stopped (the provider's
// side of the check), starts it and checks that the machine runs with its agent and the file
// kept the word.
func (e *env) stopStartKeepsFile(sid, label string, exec func(argv ...string) string, stopped func(m machine)) {
	t := e.t
	t.Helper()
	word := randomWord()
	exec("sh", "-c", "echo "+word+" > /root/kept && sync")
	e.run("machine", "stop", label, "--stack", sid)
	m := e.machines(sid)[label]
	if m.State != "Stopped" {
		t.Fatalf("%s after stop: %+v", label, m)
	}
	stopped(m)
	e.run("machine", "start", label, "--stack", sid)
	if m := e.machines(sid)[label]; m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("%s after start: %+v", label, m)
	}
	if got := exec("cat", "/root/kept"); got != word {
		t.Errorf("%s after stop and start: /root/kept holds %q, want %q", label, got, word)
	}
}

// kites returns the registered kites the CLI's user may see, by kite id.
func (e *env) kites() map[string]kiteInfo {
	var ks []kiteInfo
	e.runJSON(&ks, "kites")
	out := map[string]kiteInfo{}
	for _, k := range ks {
		out[k.Kite.ID] = k
	}
	return out
}

// snapshotRestoresFile is the README's snapshot walk-through on machine label (hostname: the
// label with "-" for ".") of stack sid through the CLI, exec running a command in the machine:
// snapshot of the running machine (stopped, saved, started again with its agent) → write a file →
// restore → the file is gone and the one saved is back; the agent reconnects as itself; the
// snapshot is listed with its size and deleted with its data, the file dataFile(snapshot id)
// where the provider keeps it. It expects to take the user's first snapshot.
func (e *env) snapshotRestoresFile(sid, label string, exec func(argv ...string) string, dataFile func(snapID string) string) {
	t := e.t
	t.Helper()
	m := e.machines(sid)[label]
	if m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("%s before its snapshot: %+v", label, m)
	}
	word := randomWord()
	exec("sh", "-c", "echo "+word+" > /root/saved && sync")

	// Its last line is the snapshot's id.
	out := strings.Fields(e.run("machine", "snapshot", label, "--stack", sid, "--name", "before the change"))
	var snapID string
	if len(out) > 0 {
		snapID = out[len(out)-1]
	}
	if m := e.machines(sid)[label]; m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("%s after its snapshot: %+v", label, m)
	}
	var list struct {
		Snapshots []struct {
			ID, Name, Status, MachineLabel string
			Size                           int64
		}
		Used struct{ Count int }
	}
	e.runJSON(&list, "machine", "snapshots")
	if len(list.Snapshots) != 1 || list.Snapshots[0].ID != snapID || list.Snapshots[0].Status != "ready" ||
		list.Snapshots[0].Size <= 0 || list.Snapshots[0].Name != "before the change" || list.Used.Count != 1 {
		t.Fatalf("machine snapshots: %+v", list)
	}
	if out := e.run("machine", "snapshots", label, "--stack", sid); !strings.Contains(out, "before the change") || !strings.Contains(out, "used 1 of 10 snapshots") {
		t.Errorf("machine snapshots table:\n%s", out)
	}

	exec("sh", "-c", "echo changed > /root/saved && echo new > /root/later && sync")
	e.run("machine", "restore", snapID)
	m2 := e.machines(sid)[label]
	if m2.State != "Running" || m2.Agent.Status != "connected" || m2.KiteID != m.KiteID {
		t.Fatalf("%s after restore: %+v (kite before %s)", label, m2, m.KiteID)
	}
	if got := exec("cat", "/root/saved"); got != word {
		t.Errorf("/root/saved after restore: %q, want %q", got, word)
	}
	if got := exec("sh", "-c", "test -e /root/later && echo present || echo gone"); got != "gone" {
		t.Errorf("/root/later (written after the snapshot) after restore: %s", got)
	}
	if k, ok := e.kites()[m.KiteID]; !ok || k.Kite.Hostname != strings.ReplaceAll(label, ".", "-") {
		t.Errorf("%s's kite after restore: %+v (registered %v)", label, k, ok)
	}

	file := dataFile(snapID)
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the snapshot's data: %v", err)
	}
	e.run("snapshot", "delete", snapID)
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the snapshot's data after delete: %v", err)
	}
	if out, err := e.try("machine", "restore", snapID); err == nil || !strings.Contains(out, "not found") {
		t.Errorf("restore of a deleted snapshot: %v\n%s", err, out)
	}
}
