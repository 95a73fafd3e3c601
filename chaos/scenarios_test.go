package chaos

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/pluginhost"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// resumeTarget is issue 23's target: a restarted kloud resumes its own jobs within it.
const resumeTarget = 3 * time.Second

// jobTimeout bounds an operation after the kill: a job still not ended then is stuck. It is
// above every bound kloud itself keeps (the planner waits 5 minutes for agents), so that a job
// slowed down by a loaded host is not called stuck while kloud is still within its own limits.
const jobTimeout = 7 * time.Minute

// scenario is an operation on a stack (of local machines, or the example provider's) and the
// process killed during it.
type scenario struct {
	name string
	// victim is what is killed: "kloud" (then started again), "terraformer" (kloud's
	// supervisor starts another), "plugin" (the example provider's; kloud's plugin host starts
	// another) or "klient" (the machine's restart loop starts another).
	victim string
	// window is where the kill point is drawn from, from the operation's start: about its
	// duration on an idle host (repeat shortens it when a job ends before its kill point).
	window time.Duration
	// example: the stacks are the example provider plugin's machines (world.withExample).
	example bool
	// prepare readies run r for its operation: the template and the stack, built or not.
	prepare func(r *run)
	// op starts the operation and returns its job's id.
	op func(r *run) string
	// asked reports whether the stack is what the operation asked for, and if not what it is.
	asked func(r *run) (bool, string)
}

func scenarios() []scenario {
	built := func(r *run) {
		r.tid = r.w.template(1)
		r.sid = r.w.createStack(r.tid)
		if out, err := r.w.cli(jobTimeout, "stack", "apply", r.sid); err != nil {
			// Not what the suite measures (no kill yet): once more, and say so.
			r.w.t.Logf("preparing: %v\n%s\napplying again", err, out)
			r.w.mustCLI("stack", "apply", r.sid)
		}
	}
	apply := scenario{
		prepare: func(r *run) { r.tid = r.w.template(1); r.sid = r.w.createStack(r.tid) },
		op:      func(r *run) string { return r.w.startJob("stack", "apply", r.sid) },
		asked:   func(r *run) (bool, string) { return r.w.running(r.sid, 1) },
	}
	destroy := scenario{
		prepare: built,
		op:      func(r *run) string { return r.w.startJob("stack", "destroy", r.sid) },
		asked: func(r *run) (bool, string) {
			_, _, found, err := r.w.stackState(r.sid)
			if err != nil || found {
				return false, fmt.Sprintf("stack %s after its destroy: found %v, %v", r.sid, found, err)
			}
			for _, in := range r.w.sandboxes() {
				if in.Tags[local.TagStack] == r.sid {
					return false, fmt.Sprintf("machine %s of the destroyed stack is %s", in.ID, in.State)
				}
			}
			return true, ""
		},
	}
	update := scenario{
		prepare: func(r *run) { built(r); r.w.updateTemplate(r.tid, 2) },
		op:      func(r *run) string { return r.w.startJob("stack", "update", r.sid) },
		asked:   func(r *run) (bool, string) { return r.w.running(r.sid, 2) },
	}
	snapshot := scenario{
		prepare: built,
		op:      func(r *run) string { return r.w.startJob("machine", "snapshot", "vm.0", "--stack", r.sid) },
		asked: func(r *run) (bool, string) {
			snaps, err := r.w.snapshots()
			if err != nil || len(snaps) != 1 || snaps[0].Status != "ready" {
				return false, fmt.Sprintf("snapshots after the snapshot: %+v %v", snaps, err)
			}
			return r.w.running(r.sid, 1)
		},
	}
	example := func(s scenario) scenario { s.example = true; return s }
	named := func(s scenario, name, victim string, window time.Duration) scenario {
		s.name, s.victim, s.window = name, victim, window
		return s
	}
	return []scenario{
		named(apply, "kloud-apply", "kloud", 15*time.Second),
		named(destroy, "kloud-destroy", "kloud", 8*time.Second),
		named(update, "kloud-update", "kloud", 15*time.Second),
		named(snapshot, "kloud-snapshot", "kloud", 10*time.Second),
		named(apply, "terraformer-apply", "terraformer", 15*time.Second),
		// klient exists once the machine booted: killed at the first moment it runs after the
		// kill point.
		named(apply, "klient-apply", "klient", 15*time.Second),
		// The restarted plugin powers its machines on again (their processes died with it): a
		// build that ended meanwhile finds its agent back within pluginSettle.
		settles(example(named(apply, "plugin-apply", "plugin", 10*time.Second)), pluginSettle),
	}
}

// pluginSettle is how long after its operation's end a plugin-apply stack may take to be as
// asked: the machines the restarted plugin powers on again take seconds to connect their agents
// (on a loaded host, the sandboxed plugin's own start took 13s in CI).
const pluginSettle = 90 * time.Second

// settles returns s whose check is retried for up to d until it holds.
func settles(s scenario, d time.Duration) scenario {
	asked := s.asked
	s.asked = func(r *run) (bool, string) {
		for deadline := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
			ok, why := asked(r)
			if ok || time.Now().After(deadline) {
				return ok, why
			}
		}
	}
	return s
}

// TestChaos runs every scenario CHAOS_N times (default 1), each in a world of its own, in
// parallel, and prints the table of outcomes (written to CHAOS_REPORT too). A scenario fails
// unless every run ended as the user asked, none stuck or leaked, and (kloud killed, with
// CHAOS_TARGETS=1) every resumption took less than 3 s plus CHAOS_SLACK.
func TestChaos(t *testing.T) {
	cfg := config(t)
	t.Logf("chaos: CHAOS_N=%d CHAOS_SEED=%d CHAOS_SLACK=%s CHAOS_TARGETS=%v (repeat with these)", cfg.n, cfg.seed, cfg.slack, cfg.timed)
	var mu sync.Mutex
	var rows []summary
	t.Cleanup(func() { // after every parallel subtest
		mu.Lock()
		defer mu.Unlock()
		slices.SortFunc(rows, func(a, b summary) int { return strings.Compare(a.name, b.name) })
		table := report(cfg, rows)
		t.Logf("fault suite:\n%s", table)
		if p := os.Getenv("CHAOS_REPORT"); p != "" {
			if err := os.WriteFile(p, []byte(table), 0o644); err != nil {
				t.Error(err)
			}
		}
	})
	for _, s := range scenarios() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			sum := s.repeat(t, cfg)
			mu.Lock()
			rows = append(rows, sum)
			mu.Unlock()
			sum.assert(t, cfg)
		})
	}
}

type chaosConfig struct {
	n     int
	seed  uint64
	slack time.Duration
	// timed: assert the recovery target (CHAOS_TARGETS=1, set by make chaos); otherwise the
	// recovery times are figures in the table.
	timed  bool
	commit string // the tree the suite was built from
}

func config(t *testing.T) chaosConfig {
	c := chaosConfig{n: 1, seed: uint64(time.Now().UnixNano()), slack: 2 * time.Second, commit: commit()}
	var err error
	if v := os.Getenv("CHAOS_N"); v != "" {
		if c.n, err = strconv.Atoi(v); err != nil || c.n < 1 {
			t.Fatalf("CHAOS_N=%q: want a positive number", v)
		}
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		if c.seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
	}
	c.timed = os.Getenv("CHAOS_TARGETS") == "1"
	if v := os.Getenv("CHAOS_SLACK"); v != "" {
		if c.slack, err = time.ParseDuration(v); err != nil {
			t.Fatalf("CHAOS_SLACK=%q: %v", v, err)
		}
	}
	return c
}

// run is one operation with one kill.
type run struct {
	w        *world
	tid, sid string
	seen     map[string]sandbox.Info // every machine seen on the host during the run
}

// result is how one run ended.
type result struct {
	killed   bool          // false: the job ended before the kill point
	killAt   time.Duration // the kill point, from the operation's start
	outcome  string        // "asked", "failed" or "stuck"
	reason   string        // why it is not "asked"
	leaked   []string      // invariants that did not hold, after the run or after the destroy
	recovery time.Duration // kill (or kloud's restart) to the job running again; <0: none
	took     time.Duration // the operation's start to its job's end (as polled)
}

// repeat runs the scenario cfg.n times, each with a seeded random kill point in its window. A
// run whose job ended before the kill point is done again (at most twice) with the window
// shortened to 90% of that job's duration: the host's load decides how long an operation takes.
func (s scenario) repeat(t *testing.T, cfg chaosConfig) summary {
	w := newWorld(t)
	if s.example {
		w.withExample()
	}
	h := fnv.New64a()
	h.Write([]byte(s.name))
	rng := rand.New(rand.NewPCG(cfg.seed, h.Sum64()))
	sum := summary{name: s.name, victim: s.victim, window: s.window}
	for i := range cfg.n {
		var res result
		for try := 0; ; try++ {
			res = s.once(t, w, time.Duration(rng.Int64N(int64(sum.window))))
			t.Logf("%s run %d: killed %v at %s (the job took %s): %s %s; recovery %s; leaked %q", s.name, i+1, res.killed,
				res.killAt.Round(time.Millisecond), res.took.Round(time.Millisecond), res.outcome, res.reason, res.recovery.Round(time.Millisecond), res.leaked)
			if res.killed || try == 2 {
				break
			}
			if len(res.leaked) > 0 || res.outcome != "asked" {
				t.Errorf("%s run %d without a kill: %s %s; %s", s.name, i+1, res.outcome, res.reason, strings.Join(res.leaked, "; "))
			}
			sum.window = min(sum.window, res.took*9/10)
		}
		sum.results = append(sum.results, res)
	}
	return sum
}

// once runs the operation, kills the victim at killAt after its start, follows the job to its
// end and checks the outcome and the invariants, then destroys what is left and checks again.
func (s scenario) once(t *testing.T, w *world, killAt time.Duration) result {
	r := &run{w: w, seen: map[string]sandbox.Info{}}
	if s.victim == "plugin" {
		w.pluginSteady(pluginhost.DefaultResetAfter + time.Second)
	}
	s.prepare(r)
	r.note()
	res := result{killAt: killAt, recovery: -1}
	jobID := s.op(r)
	start := time.Now()
	deadline := start.Add(killAt)
	var last api.Job // the job as last seen before the kill
	for time.Now().Before(deadline) {
		if j, err := w.job(jobID); err == nil {
			last = j
		}
		if last.Status.Done() {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !last.Status.Done() {
		r.note()
		res.killed = true
		switch s.victim {
		case "kloud":
			if res.recovery = r.killKloud(jobID, last.Attempt); res.recovery == endedBeforeKill {
				res.killed, res.recovery = false, -1 // not a kill mid-job
			}
		case "terraformer":
			res.recovery = r.killTerraformer()
		case "klient":
			res.killed, res.recovery = r.killKlient(jobID)
		case "plugin":
			res.recovery = r.killPlugin()
		default:
			t.Fatalf("unknown victim %q", s.victim)
		}
	}
	j := w.waitJob(jobID, jobTimeout)
	res.took = time.Since(start)
	r.note()
	switch {
	case !j.Status.Done():
		res.outcome, res.reason = "stuck", fmt.Sprintf("job %s %s at %d%% after %s", j.ID, j.Status, j.Percent, jobTimeout)
	case j.Status != api.JobSucceeded:
		res.outcome, res.reason = "failed", fmt.Sprintf("job %s: %s", j.Status, firstLine(j.Error))
	default:
		if ok, why := s.asked(r); ok {
			res.outcome = "asked"
		} else {
			res.outcome, res.reason = "failed", "job succeeded, but "+why
		}
	}
	if res.outcome != "stuck" {
		res.leaked = w.invariants()
	}
	res.leaked = append(res.leaked, r.finish()...)
	return res
}

// note records the machines on the host now, for the checks after the destroy.
func (r *run) note() {
	for _, in := range r.w.sandboxes() {
		r.seen[in.ID] = in
	}
}

// finish destroys the run's stack (if it is still there) and its snapshots, then checks the
// invariants again and that nothing is left of any machine the run saw.
func (r *run) finish() []string {
	w := r.w
	r.note()
	var bad []string
	if _, _, found, _ := w.stackState(r.sid); found {
		if out, err := w.cli(jobTimeout, "stack", "destroy", r.sid); err != nil {
			// Once more: a destroy after a kill may meet what the kill left.
			if out2, err2 := w.cli(jobTimeout, "stack", "destroy", r.sid); err2 != nil {
				bad = append(bad, fmt.Sprintf("destroy: %v\n%s\n%s", err, out, out2))
			}
		}
	}
	snaps, _ := w.snapshots()
	for _, sn := range snaps {
		if out, err := w.cli(time.Minute, "snapshot", "delete", sn.ID); err != nil {
			bad = append(bad, fmt.Sprintf("%v\n%s", err, out))
		}
	}
	bad = append(bad, w.invariants()...)
	bad = append(bad, w.strays()...)
	return append(bad, w.gone(slices.Collect(maps.Values(r.seen)))...)
}

// killKloud SIGKILLs kloud, starts it again and returns how long after it answered /healthz
// the job ran again (a new attempt); -1 if it ended without one or none came in 3 minutes.
func (r *run) killKloud(jobID string, attempt int) time.Duration {
	w := r.w
	killed := time.Now()
	w.killKloud()
	w.start()
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		j, err := w.job(jobID)
		if err != nil {
			continue
		}
		if j.Attempt > attempt {
			return time.Since(w.started)
		}
		if j.Status.Done() {
			if !j.FinishedAt.IsZero() && j.FinishedAt.Before(killed) {
				return endedBeforeKill
			}
			return -1
		}
	}
	return -1
}

// endedBeforeKill is killKloud's answer for a job that had ended before the SIGKILL: the test
// last looked at it up to 50 ms before (ci58: a destroy ended in that window, and the restarted
// kloud, rightly, did not run it again).
const endedBeforeKill = -2 * time.Nanosecond

// killTerraformer SIGKILLs the terraformer kloud supervises and returns how long until another
// one answered /healthz; -1 if none in 3 minutes.
func (r *run) killTerraformer() time.Duration {
	w := r.w
	return w.killChild("terraformer", w.terraformer, func(time.Time) bool {
		resp, err := http.Get("http://" + w.tfAddr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// killPlugin SIGKILLs the example provider's plugin and returns how long until kloud's plugin
// host had another one connected; -1 if not in 3 minutes.
func (r *run) killPlugin() time.Duration {
	w := r.w
	return w.killChild("the example plugin", w.plugin, func(killed time.Time) bool {
		var ps []api.ProviderStatus
		if err := w.cliJSON(&ps, "provider", "list"); err != nil {
			return false
		}
		for _, p := range ps {
			if p.Name == "example" && p.Connected && p.ConnectedAt != nil && p.ConnectedAt.After(killed) {
				return true
			}
		}
		return false
	})
}

// pluginSteady waits until the example plugin has been connected for d. kloud's supervisor
// takes a plugin that dies within its ResetAfter of service for one crash-looping and waits
// longer before each restart (doubling up to 30 s); runs that kill it every few seconds (a job
// of a second or two, then the next run) would measure that backoff, 30 s from the eighth kill
// on (`make chaos` of f89e2e6: recovery median 30.9 s), not a plugin's restart mid-apply.
func (w *world) pluginSteady(d time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		var ps []api.ProviderStatus
		if err := w.cliJSON(&ps, "provider", "list"); err == nil {
			for _, p := range ps {
				if p.Name != "example" || !p.Connected || p.ConnectedAt == nil {
					continue
				}
				left := d - time.Since(*p.ConnectedAt)
				if left <= 0 {
					return
				}
				time.Sleep(left)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.t.Fatalf("the example plugin was not connected for %s in 3 minutes", d)
}

// killChild SIGKILLs the process of kloud's that find returns (what names it) and returns how
// long until another one runs and up reports it serves; -1 if not in 3 minutes.
func (w *world) killChild(what string, find func() int, up func(killed time.Time) bool) time.Duration {
	old := find()
	if old == 0 {
		w.t.Fatalf("kloud %d runs no %s", w.kloud.Process.Pid, what)
	}
	syscall.Kill(old, syscall.SIGKILL)
	killed := time.Now()
	for time.Since(killed) < 3*time.Minute {
		if pid := find(); pid != 0 && pid != old && up(killed) {
			return time.Since(killed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return -1
}

// terraformer is the pid of kloud's terraformer child, 0 if none runs.
func (w *world) terraformer() int {
	for _, p := range procs() {
		if p.ppid == w.kloud.Process.Pid && p.comm == "terraformer" {
			return p.pid
		}
	}
	return 0
}

// killKlient SIGKILLs the first klient that runs in a machine of the run's stack from now on
// (none if job jobID ends first or none runs within jobTimeout: killed false) and returns how
// long until the machine's agent was connected again from a new klient; -1 if not in 3 minutes.
func (r *run) killKlient(jobID string) (killed bool, recovery time.Duration) {
	w := r.w
	var victim proc
	var machine sandbox.Info
	for deadline := time.Now().Add(jobTimeout); victim.pid == 0; {
		for _, in := range w.sandboxes() {
			if in.Tags[local.TagStack] != r.sid || in.PID == 0 {
				continue
			}
			for _, p := range descendants(procs(), in.PID) {
				if p.comm == "klient" {
					victim, machine = p, in
				}
			}
		}
		if victim.pid != 0 {
			break
		}
		if j, err := w.job(jobID); err == nil && j.Status.Done() || time.Now().After(deadline) {
			return false, -1
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(victim.pid, syscall.SIGKILL)
	at := time.Now()
	for time.Since(at) < 3*time.Minute {
		again := false
		for _, p := range descendants(procs(), machine.PID) {
			again = again || p.comm == "klient" && p.pid != victim.pid
		}
		if again {
			if ms, err := w.machines(r.sid); err == nil {
				for _, m := range ms {
					if m.sandboxID() == machine.ID && m.Agent.Status == "connected" {
						return true, time.Since(at)
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true, -1
}

// sandboxes is every machine on the world's host.
func (w *world) sandboxes() []sandbox.Info {
	infos, err := w.h.Manager.List(w.t.Context())
	if err != nil {
		w.t.Errorf("sandbox list: %v", err)
	}
	return infos
}

type snapshotInfo struct{ ID, Status string }

func (w *world) snapshots() ([]snapshotInfo, error) {
	var list struct{ Snapshots []snapshotInfo }
	err := w.cliJSON(&list, "machine", "snapshots")
	return list.Snapshots, err
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// summary is a scenario's runs.
type summary struct {
	name, victim string
	window       time.Duration
	results      []result
}

// counts returns the runs killed, ended as asked, failed, stuck and leaked.
func (s summary) counts() (killed, asked, failed, stuck, leaked int) {
	for _, r := range s.results {
		if r.killed {
			killed++
		}
		switch r.outcome {
		case "asked":
			asked++
		case "failed":
			failed++
		case "stuck":
			stuck++
		}
		if len(r.leaked) > 0 {
			leaked++
		}
	}
	return
}

// recoveries returns the median and worst recovery, and how many runs had one.
func (s summary) recoveries() (median, worst time.Duration, n int) {
	var ds []time.Duration
	for _, r := range s.results {
		if r.killed && r.recovery >= 0 {
			ds = append(ds, r.recovery)
		}
	}
	if len(ds) == 0 {
		return -1, -1, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)-1], len(ds)
}

// assert fails the scenario unless it met issue 23's targets.
func (s summary) assert(t *testing.T, cfg chaosConfig) {
	for i, r := range s.results {
		if r.outcome != "asked" {
			t.Errorf("run %d (kill at %s): %s: %s", i+1, r.killAt.Round(time.Millisecond), r.outcome, r.reason)
		}
		if len(r.leaked) > 0 {
			t.Errorf("run %d (kill at %s): left behind or inconsistent: %s", i+1, r.killAt.Round(time.Millisecond), strings.Join(r.leaked, "; "))
		}
		if s.victim == "kloud" && r.killed && r.outcome == "asked" && r.recovery < 0 {
			t.Errorf("run %d (kill at %s): the restarted kloud did not run the job again", i+1, r.killAt.Round(time.Millisecond))
		}
		if s.victim == "kloud" && r.recovery > resumeTarget+cfg.slack {
			if !cfg.timed {
				// make test shares 2 cores with every other package: a figure there, not a
				// verdict (the table shows it).
				t.Logf("NOTE: run %d (kill at %s): the restarted kloud resumed the job after %s, over the target %s (+%s slack); asserted only under make chaos (CHAOS_TARGETS=1)", i+1,
					r.killAt.Round(time.Millisecond), r.recovery.Round(time.Millisecond), resumeTarget, cfg.slack)
				continue
			}
			t.Errorf("run %d (kill at %s): the restarted kloud resumed the job after %s, target %s (+%s slack)", i+1,
				r.killAt.Round(time.Millisecond), r.recovery.Round(time.Millisecond), resumeTarget, cfg.slack)
		}
	}
}

// report is the table of the scenarios' outcomes in Markdown, for docs/RELIABILITY.md.
func report(cfg chaosConfig, rows []summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`CHAOS_N=%d CHAOS_SEED=%d make chaos` on %s, %s\n\n", cfg.n, cfg.seed, cfg.commit, time.Now().UTC().Format("2006-01-02"))
	b.WriteString("| scenario | SIGKILL of | N | killed | as asked | failed | stuck | leaked | recovery median | recovery worst | kill window |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	var notes []string
	for _, s := range rows {
		killed, asked, failed, stuck, leaked := s.counts()
		med, worst, _ := s.recoveries()
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %s | %s | 0–%s |\n", s.name, s.victim, len(s.results), killed, asked,
			failed, stuck, leaked, seconds(med), seconds(worst), seconds(s.window))
		for i, r := range s.results {
			if r.outcome != "asked" || len(r.leaked) > 0 {
				note := fmt.Sprintf("- %s run %d, killed at %s: %s %s %s", s.name, i+1, seconds(r.killAt), r.outcome, r.reason, strings.Join(r.leaked, "; "))
				notes = append(notes, strings.Join(strings.Fields(note), " ")) // one line each
			}
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	}
	return b.String()
}

func seconds(d time.Duration) string {
	if d < 0 {
		return "–"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + " s"
}

// commit is the tree's commit (with "+changes" when it has uncommitted ones).
func commit() string {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return "?"
	}
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "?"
	}
	c := strings.TrimSpace(string(out))
	if st, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); len(st) > 0 {
		c += "+changes"
	}
	return c
}
