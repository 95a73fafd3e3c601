package e2e

// kloud keeps its own parts alive, and a kill leaves nothing running (issue 9, item 7): the
// terraformer `kloud serve` starts is restarted when it dies, calls wait for it while it is
// down (issue 23), and a SIGKILL of kloud mid-apply leaves no terraformer, terraform or provider
// process; the interrupted job resumes at once and ends as asked (issue 23).

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
)

// osProc is a process as /proc shows it.
type osProc struct {
	pid, ppid int
	start     uint64 // start time in clock ticks since boot: tells a pid reused from the one seen
	comm      string
	cmdline   string
}

func readProc(pid int) (osProc, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return osProc{}, false
	}
	// pid (comm) state ppid ... field 22 is starttime; comm may hold spaces and parentheses.
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return osProc{}, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 20 {
		return osProc{}, false
	}
	p := osProc{pid: pid, comm: s[open+1 : end]}
	p.ppid, _ = strconv.Atoi(f[1])
	p.start, _ = strconv.ParseUint(f[19], 10, 64)
	if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		p.cmdline = strings.TrimSpace(strings.ReplaceAll(string(cl), "\x00", " "))
	}
	return p, true
}

// allProcs returns every process of the host.
func allProcs() []osProc {
	ents, _ := os.ReadDir("/proc")
	var out []osProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			out = append(out, p)
		}
	}
	return out
}

// tree returns root and all its descendants.
func tree(root int) []osProc {
	ps := allProcs()
	in := map[int]bool{root: true}
	var out []osProc
	for changed := true; changed; {
		changed = false
		for _, p := range ps {
			if !in[p.pid] && in[p.ppid] {
				in[p.pid], changed = true, true
			}
		}
	}
	for _, p := range ps {
		if in[p.pid] {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether p still runs (the same process: same pid and start time, not a zombie).
func (p osProc) alive() bool {
	q, ok := readProc(p.pid)
	if !ok || q.start != p.start {
		return false
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	s := string(st)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 && s[i+2] == 'Z' {
		return false
	}
	return true
}

func (p osProc) String() string { return fmt.Sprintf("%d (%s) %s", p.pid, p.comm, p.cmdline) }

// terraformerChild returns the terraformer that kloud (pid) started.
func terraformerChild(t *testing.T, kloud int) osProc {
	t.Helper()
	var tf osProc
	testutil.Eventually(t, 30*time.Second, func() bool {
		for _, p := range allProcs() {
			if p.ppid == kloud && p.comm == "terraformer" {
				tf = p
				return true
			}
		}
		return false
	}, "kloud %d has no terraformer child", kloud)
	return tf
}

// TestTerraformerKilledIsRestarted: kill -9 of the terraformer kloud serve started → while it
// cannot come back, calls that need it (a plan, a stack create, a build) wait for it, the build's
// job saying so, and kloud logs the exit with its cause; once it can, a new one serves them
// within seconds, with no restart of kloud.
func TestTerraformerKilledIsRestarted(t *testing.T) {
	parallel(t)
	tfAddr := testutil.FreeLoopback(t)
	e := newEnv(t, "--terraformer-addr", tfAddr)
	e.alice()
	tid := e.template(`
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho hello"
}
`)
	if out := e.run("stack", "plan", "--template", tid); !strings.Contains(out, "vm") {
		t.Fatalf("plan:\n%s", out)
	}
	var created struct{ Stack struct{ ID string } }
	e.runJSON(&created, "stack", "create", "--template", tid)
	sid := created.Stack.ID
	tf := terraformerChild(t, e.kloud.Process.Pid)

	// Kill it and take its address, so the restarts fail (the address is in use) until we let
	// go: terraformer is down for as long as the test wants. The supervisor waits 100 ms before
	// the first restart; if a restart wins the race for the address anyway, kill that one too.
	var hold net.Listener
	victim := tf
	for try := 0; hold == nil; try++ {
		if try == 5 {
			t.Fatalf("could not take terraformer's address %s after killing it", tfAddr)
		}
		syscall.Kill(victim.pid, syscall.SIGKILL)
		deadline := time.Now().Add(time.Second)
		for hold == nil && time.Now().Before(deadline) {
			if ln, err := net.Listen("tcp", tfAddr); err == nil {
				hold = ln
			} else {
				time.Sleep(5 * time.Millisecond)
			}
		}
		if hold == nil {
			victim = terraformerChild(t, e.kloud.Process.Pid)
		}
	}
	released := false
	release := func() {
		if !released {
			hold.Close()
			released = true
		}
	}
	defer release()

	// While it is down, calls that need it wait for it (up to a minute), saying so, instead of
	// failing at once with "terraformer unavailable: … restarting it in 6.691s" (issue 23): a
	// plan, a stack create (it plans) and a build.
	type result struct {
		out  string
		err  error
		took time.Duration
	}
	call := func(args ...string) chan result {
		ch := make(chan result, 1)
		go func() {
			start := time.Now()
			out, err := e.try(args...)
			ch <- result{out, err, time.Since(start)}
		}()
		return ch
	}
	plan := call("stack", "plan", "--template", tid)
	create := call("stack", "create", "--template", tid, "--json")
	out := e.run("stack", "apply", sid, "--detach")
	jobID := strings.Fields(strings.TrimPrefix(out, "job "))[0]
	// Minutes, not seconds: on a loaded host a race-built terraformer took 14s to start and fail
	// on the held address (ci50), and each CLI call here is a process too.
	testutil.Eventually(t, 2*time.Minute, func() bool {
		o, _ := e.try("job", "get", jobID)
		return strings.Contains(o, "waiting for the terraformer (restarting)")
	}, "the build's job does not say it waits for the terraformer:\n%s", func() string { o, _ := e.try("job", "get", jobID); return o }())
	// kloud logs the exit with its cause, and each restart (failing while we hold the address).
	testutil.Eventually(t, 2*time.Minute, func() bool {
		log := e.kloudOut.String()
		return strings.Contains(log, `msg="terraformer exited"`) && strings.Contains(log, `cause="signal: killed"`) &&
			strings.Contains(log, `msg="restarting terraformer"`) && strings.Contains(log, `msg="terraformer restart failed"`)
	}, "kloud did not log terraformer's exit, its cause and the restarts:\n%s", e.kloudOut)
	select {
	case r := <-plan:
		t.Fatalf("plan while terraformer is down ended before it came back (%s): %v\n%s", r.took, r.err, r.out)
	default:
	}

	release()
	back := time.Now()
	for name, ch := range map[string]chan result{"plan": plan, "create": create} {
		r := <-ch
		t.Logf("%s made while terraformer was down: %s, %s after its address was free: %v\n%s", name, r.took.Round(time.Millisecond), time.Since(back).Round(time.Millisecond), r.err, r.out)
		if r.err != nil {
			t.Errorf("%s made while terraformer was down failed: %v\n%s", name, r.err, r.out)
		}
		if name == "create" {
			var created struct{ Stack struct{ ID string } }
			if json.Unmarshal([]byte(r.out), &created) == nil && created.Stack.ID != "" {
				defer e.run("stack", "destroy", created.Stack.ID)
			}
		}
	}
	final, _ := e.try("job", "watch", jobID)
	var j struct{ Status, Error string }
	e.runJSON(&j, "job", "get", jobID)
	t.Logf("the build started while terraformer was down: %+v\n%s", j, final)
	if j.Status != "succeeded" {
		t.Fatalf("the build started while terraformer was down: %+v", j)
	}
	if nt := terraformerChild(t, e.kloud.Process.Pid); nt.pid == tf.pid {
		t.Fatalf("the same terraformer %d still runs", tf.pid)
	}
	if !strings.Contains(e.kloudOut.String(), "terraformer restarted") {
		t.Errorf("kloud did not log the restart:\n%s", e.kloudOut)
	}

	// The destroy goes through the new terraformer.
	e.run("stack", "destroy", sid)
}

// TestKloudKilledMidApplyLeavesNothing: kill -9 of kloud while terraform applies → its
// terraformer (told by the kernel: Pdeathsig), the terraform run and everything that run started
// are gone within seconds; a restarted kloud resumes the job at once, though its runner lease
// (resumeLease) has not expired: the lease names the dead process of the same instance
// (issue 23: every resumption took 31s); the resumed job runs terraform again (its run died
// with its process; issue 23: such a job ended Failed) and the build succeeds, and the stack
// can be destroyed.
func TestKloudKilledMidApplyLeavesNothing(t *testing.T) {
	parallel(t)
	e := newEnv(t, "--terraformer-addr", testutil.FreeLoopback(t), "--job-lease", resumeLease)
	sid, jobID, tf := startLongApply(t, e)

	// Kill kloud as soon as terraform apply runs under its terraformer.
	victims := whenApplying(t, e, tf.pid, func() { e.kloud.Process.Signal(syscall.SIGKILL) })
	e.kill()
	t.Logf("killed kloud while these ran under its terraformer:\n%s", procList(victims))
	assertGone(t, e, victims)

	e.start()
	restarted := time.Now()
	resumed := e.resumedAfter(jobID)
	checkResumed(t, "job "+jobID, resumed)
	final, _ := e.try("job", "watch", jobID)
	t.Logf("the build ended %s after the restart:\n%s", time.Since(restarted).Round(time.Millisecond), final)
	var j struct {
		Status, Error string
		Log           []string
	}
	if err := json.Unmarshal([]byte(e.run("job", "get", jobID)), &j); err != nil {
		t.Fatal(err)
	}
	if j.Status != "succeeded" {
		t.Fatalf("job after the restart: %+v", j)
	}
	for l, m := range e.machines(sid) {
		if m.State == "Building" {
			t.Fatalf("%s stuck in Building after the restart: %+v", l, m)
		}
		if j.Status == "succeeded" && (m.State != "Running" || m.Agent.Status != "connected") {
			t.Fatalf("build succeeded but %s is %+v", l, m)
		}
	}
	e.run("stack", "destroy", sid)
	if entries, _ := os.ReadDir(filepath.Join(e.dir, "machines", sid)); len(entries) != 0 {
		t.Fatalf("machine directories left: %v", entries)
	}
}

// TestTerraformerKilledMidApply: kill -9 of kloud's terraformer while terraform applies → the
// terraform run and everything it started die with it; kloud (still running) starts a new
// terraformer, and the build runs terraform again on it (apply converges on the state the dead
// run left) and succeeds; the stack is built again and destroyed.
func TestTerraformerKilledMidApply(t *testing.T) {
	parallel(t)
	e := newEnv(t, "--terraformer-addr", testutil.FreeLoopback(t))
	sid, jobID, tf := startLongApply(t, e)
	victims := whenApplying(t, e, tf.pid, func() { syscall.Kill(tf.pid, syscall.SIGKILL) })
	killed := time.Now()
	t.Logf("killed terraformer while these ran under it:\n%s", procList(victims))
	assertGone(t, e, victims)

	e.rerunSucceeded(jobID, "running it again")
	t.Logf("the build ended %s after the kill", time.Since(killed).Round(time.Millisecond))
	for l, m := range e.machines(sid) {
		if m.State != "Running" || m.Agent.Status != "connected" {
			t.Fatalf("%s after the build: %+v", l, m)
		}
	}
	if nt := terraformerChild(t, e.kloud.Process.Pid); nt.pid == tf.pid {
		t.Fatal("no new terraformer")
	}
	// The next build goes through the new terraformer (once the dead one's lease expired).
	e.apply(sid)
	e.run("stack", "destroy", sid)
}

// rerunSucceeded follows job jobID to its end and fails the test unless it ran terraform again
// after its run died with terraformer (its log says "died with its process; " + rerun) and then
// succeeded; it returns the job's log.
func (e *env) rerunSucceeded(jobID, rerun string) []string {
	e.t.Helper()
	final, _ := e.try("job", "watch", jobID)
	var j struct {
		Status, Error string
		Log           []string
	}
	if err := json.Unmarshal([]byte(e.run("job", "get", jobID)), &j); err != nil {
		e.t.Fatal(err)
	}
	if j.Status != "succeeded" || !slices.ContainsFunc(j.Log, func(l string) bool { return strings.Contains(l, "died with its process") && strings.Contains(l, rerun) }) {
		e.t.Fatalf("the build whose terraform run was killed: want it run again and succeeded: %+v\n%s", j, final)
	}
	return j.Log
}

// resumedAfter returns how long after now job jobID, interrupted by a kill of kloud during its
// first attempt, was taken by the restarted kloud (its second attempt), polling job get; at most
// a minute.
func (e *env) resumedAfter(jobID string) time.Duration {
	e.t.Helper()
	start := time.Now()
	testutil.Eventually(e.t, time.Minute, func() bool {
		var j struct{ Attempt int }
		o, err := e.try("job", "get", jobID)
		return err == nil && json.Unmarshal([]byte(o), &j) == nil && j.Attempt > 1
	}, "job %s was not resumed", jobID)
	return time.Since(start)
}

// whenApplying calls kill as soon as a terraform apply runs under terraformer tf, and returns
// what ran under it then.
func whenApplying(t *testing.T, e *env, tf int, kill func()) []osProc {
	t.Helper()
	return whenTerraform(t, e, tf, "apply", kill)
}

// whenTerraform calls kill as soon as terraform runs with arg (its command: "apply") under
// terraformer tf, and returns what ran under it then.
func whenTerraform(t *testing.T, e *env, tf int, arg string, kill func()) []osProc {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		ps := tree(tf)
		for _, p := range ps {
			if p.comm == "terraform" && strings.Contains(p.cmdline, arg) {
				kill()
				return ps
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never saw terraform %s under terraformer %d; kloud:\n%s", arg, tf, e.kloudOut)
	return nil
}

// resumeLease is the job lease of the tests that kill kloud: long, so that a resumption that
// waited for it (issue 23: every one took 31s) is told apart from a slow one on a loaded host.
const resumeLease = "2m"

// checkResumed fails the test if a restarted kloud resumed its job only after the job lease
// (resumed: from its /healthz answering); the target (< 3s, issue 23) is a figure in the log,
// asserted by `make chaos` (CHAOS_TARGETS=1), not here: on a 2-core host running the whole suite
// the time is the host's.
func checkResumed(t *testing.T, what string, resumed time.Duration) {
	t.Helper()
	t.Logf("the restarted kloud resumed %s %s after it answered (target < 3s)", what, resumed.Round(time.Millisecond))
	if lease, _ := time.ParseDuration(resumeLease); resumed >= lease/2 {
		t.Errorf("resumed %s %s after the restart: it waited for the job lease (%s), want at once", what, resumed, resumeLease)
	}
}

// TestKloudKilledMidDestroy: kill -9 of kloud while terraform destroys a built stack → a
// restarted kloud resumes the destroy at once (its lease names the dead process), runs terraform
// destroy again and ends as asked: the stack gone, nothing of it left.
func TestKloudKilledMidDestroy(t *testing.T) {
	parallel(t)
	e := newEnv(t, "--terraformer-addr", testutil.FreeLoopback(t), "--job-lease", resumeLease)
	sid, build, _ := startLongApply(t, e)
	if out, err := e.try("job", "watch", build); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	tf := terraformerChild(t, e.kloud.Process.Pid)
	out := e.run("stack", "destroy", sid, "--detach")
	jobID := strings.Fields(strings.TrimPrefix(out, "job "))[0]
	victims := whenTerraform(t, e, tf.pid, "destroy", func() { e.kloud.Process.Signal(syscall.SIGKILL) })
	e.kill()
	assertGone(t, e, victims)
	e.start()
	restarted := time.Now()
	resumed := e.resumedAfter(jobID)
	checkResumed(t, "the destroy", resumed)
	final, _ := e.try("job", "watch", jobID)
	var j struct{ Status, Error string }
	e.runJSON(&j, "job", "get", jobID)
	t.Logf("the destroy ended %s after the restart: %+v\n%s", time.Since(restarted).Round(time.Millisecond), j, final)
	if j.Status != "succeeded" {
		t.Fatalf("destroy after the restart: %+v", j)
	}
	if ms := e.machines(sid); len(ms) != 0 {
		t.Fatalf("machines left: %+v", ms)
	}
	if entries, _ := os.ReadDir(filepath.Join(e.dir, "machines", sid)); len(entries) != 0 {
		t.Fatalf("machine directories left: %v", entries)
	}
}

// assertGone fails the test unless every process of victims, and any terraformer, terraform or
// provider plugin of e, is gone within seconds.
func assertGone(t *testing.T, e *env, victims []osProc) {
	t.Helper()
	var left []osProc
	testutil.Eventually(t, 45*time.Second, func() bool {
		left = left[:0]
		for _, p := range victims {
			if p.alive() {
				left = append(left, p)
			}
		}
		// Anything else of this kloud's terraformer, started after we looked.
		for _, p := range allProcs() {
			if (p.comm == "terraformer" || p.comm == "terraform" || strings.HasPrefix(p.comm, "terraform-provi")) &&
				strings.Contains(p.cmdline, e.dir) && p.alive() && !slices.ContainsFunc(victims, func(v osProc) bool { return v.pid == p.pid }) {
				if e.kloud.ProcessState == nil && p.ppid == e.kloud.Process.Pid && p.comm == "terraformer" {
					continue // kloud is running: this is its new terraformer
				}
				left = append(left, p)
			}
		}
		return len(left) == 0
	}, "processes left:\n%s", procsOf{&left})
}

// procsOf prints a list of processes when the message is formatted, not when it is made.
type procsOf struct{ ps *[]osProc }

func (p procsOf) String() string { return procList(*p.ps) }

func procList(ps []osProc) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	return b.String()
}

// TestLocalAgentDownloadRefused is the mistake of issue 9: kloud listens on loopback while the
// local provider's machines dial the bridge address. kloud serve warns at startup and says what
// to use; a build then fails within seconds of the machine's first download attempts, naming
// the step and curl's error from the machine's console, not after the 5 minute agent timeout.
func TestLocalAgentDownloadRefused(t *testing.T) {
	parallel(t)
	h := tfprovidertest.NewHost(t) // gates on root, ip, nsenter, the base image
	testutil.RequireBinary(t, "curl")
	addr := testutil.FreeLoopback(t) // 127.0.0.1:N
	_, port, _ := net.SplitHostPort(addr)
	e := newTerraformerEnv(t, addr, kloudlocalMirror(t), "--no-demo",
		"--local-state-dir", h.StateDir, "--local-bridge", h.Bridge, "--local-subnet", h.Subnet.String())
	le := &localEnv{env: e, h: h}
	bridgeURL := "http://" + net.JoinHostPort(h.HostAddr().String(), port)
	// The warning comes once kloud has looked at its providers, which can be after it answers
	// (a loaded host: ci23 printed it after the test had read the output).
	warns := []string{"warning: kloud listens on " + addr, "machines of provider local reach kloud at " + bridgeURL,
		"--addr :" + port, "--addr " + net.JoinHostPort(h.HostAddr().String(), port)}
	testutil.Eventually(t, 30*time.Second, func() bool {
		for _, w := range warns {
			if !strings.Contains(e.kloudOut.String(), w) {
				return false
			}
		}
		return true
	}, "kloud serve did not warn %q:\n%s", warns, e.kloudOut)

	e.alice()
	tid := e.template(localTemplate("web", 1, "#!/bin/bash\necho hi"))
	sid := le.createStack(tid)
	start := time.Now()
	out, err := e.try("stack", "apply", sid)
	took := time.Since(start)
	t.Logf("apply after %s: %v\n%s", took, err, out)
	if err == nil || !strings.Contains(out, "agent download failed inside the machine") || !strings.Contains(out, "curl: (7)") ||
		!strings.Contains(out, bridgeURL+"/dl/klient") {
		t.Fatalf("want the build to fail at the agent download with curl's error, got %v:\n%s", err, out)
	}
	if strings.Contains(out, "did not register within") || took > 2*time.Minute {
		t.Errorf("the build failed after %s: the planner waited for its timeout", took)
	}
	for l, m := range le.machines(sid) {
		if m.State == "Building" {
			t.Errorf("%s stuck in Building: %+v", l, m)
		}
	}
	infos := le.sandboxInfos()
	e.run("stack", "destroy", sid)
	le.assertNothingLeft(infos)
}

// startLongApply builds, as alice, a stack of enough machines that terraform's apply lasts a
// while, and starts its apply detached: the stack, the build job and kloud's terraformer child.
func startLongApply(t *testing.T, e *env) (sid, jobID string, tf osProc) {
	t.Helper()
	e.alice()
	tid := e.template(`
resource "terraform_data" "vm" {
  count = 12
  input = "#!/bin/bash\necho hi"
}
`)
	var created struct{ Stack struct{ ID string } }
	e.runJSON(&created, "stack", "create", "--template", tid)
	sid = created.Stack.ID
	tf = terraformerChild(t, e.kloud.Process.Pid)
	out := e.run("stack", "apply", sid, "--detach")
	return sid, strings.Fields(strings.TrimPrefix(out, "job "))[0], tf
}
