package chaos

// The invariants every run ends with, each returning what it found wrong (nil: holds), so a
// run counts a violation as "leaked" and goes on: no job stuck and no job lease held past its
// expiry; the store's machines and the terraform state agree; nothing on the host that no stack
// owns (machines, their processes, netns, veths, mounts, cgroups; terraform runs).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// checkJobs: every job of alice ended, or is running under a lease that has not expired (a
// running job whose lease ran out is one nobody runs: stuck, its lease held past expiry). It
// returns the stacks that have a job not ended (busy: their store and state are in flux).
func (w *world) checkJobs() (busy map[string]bool, bad []string) {
	var jobs []api.Job
	if err := w.cliJSON(&jobs, "job", "list"); err != nil {
		return nil, []string{fmt.Sprintf("job list: %v", err)}
	}
	busy = map[string]bool{}
	now := time.Now()
	for _, j := range jobs {
		if j.Status.Done() {
			continue
		}
		if sid, ok := strings.CutPrefix(j.Target, "stack/"); ok {
			busy[sid] = true
		}
		if j.Status != api.JobRunning || !j.LeaseUntil.After(now) {
			bad = append(bad, fmt.Sprintf("job %s (%s) %s, runner %q, lease until %s (now %s)", j.ID, j.Kind, j.Status,
				j.Runner, j.LeaseUntil.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano)))
		}
	}
	return busy, bad
}

// tfMachines is the ids of the templates' machine resource (w.machineType "vm") in stack sid's
// terraform state (terraformer's work
// dir of the stack; none when it has none).
func (w *world) tfMachines(sid string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(w.dir, "terraformer", "stacks", "stack-"+sid, "work", "terraform.tfstate"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil // terraform's own reading of an empty state file (a run killed early leaves one)
	}
	var st struct {
		Resources []struct {
			Mode, Type, Name string
			Instances        []struct {
				Attributes struct{ ID string }
			}
		}
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("terraform state of stack %s: %w", sid, err)
	}
	var ids []string
	for _, r := range st.Resources {
		if r.Mode != "managed" || r.Type != w.machineType || r.Name != "vm" {
			continue
		}
		for _, in := range r.Instances {
			ids = append(ids, in.Attributes.ID)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// checkState: for every stack of alice that no job is changing (busy), the machines the store
// records as built (with an id) are the terraform state's machine resources. It returns the
// machines' ids by stack, for checkHost.
func (w *world) checkState(busy map[string]bool) (owned map[string][]string, bad []string) {
	ids, err := w.stacks()
	if err != nil {
		return nil, []string{fmt.Sprintf("stack list: %v", err)}
	}
	owned = map[string][]string{}
	for _, sid := range ids {
		ms, err := w.machines(sid)
		if err != nil {
			bad = append(bad, fmt.Sprintf("machine list of stack %s: %v", sid, err))
			continue
		}
		var store []string
		for _, m := range ms {
			if id := m.sandboxID(); id != "" {
				store = append(store, id)
			}
		}
		slices.Sort(store)
		owned[sid] = store
		if busy[sid] {
			continue
		}
		tf, err := w.tfMachines(sid)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		if !slices.Equal(store, tf) {
			bad = append(bad, fmt.Sprintf("stack %s: the store's machines %v, the terraform state's %v", sid, store, tf))
		}
	}
	return owned, bad
}

// checkHost: every machine on the world's host belongs to a machine of a stack (owned, from
// checkState) or to a stack a job is changing (busy), and no terraform runs once every job
// ended (a run kloud lost track of).
func (w *world) checkHost(owned map[string][]string, busy map[string]bool) []string {
	infos, err := w.h.Manager.List(w.t.Context())
	if err != nil {
		return []string{fmt.Sprintf("sandbox list: %v", err)}
	}
	var bad []string
	for _, in := range infos {
		if sid := in.Tags[local.TagStack]; !busy[sid] && !slices.Contains(owned[sid], in.ID) {
			bad = append(bad, fmt.Sprintf("machine %s (%s, stack %q) that no stack owns", in.ID, in.State, in.Tags[local.TagStack]))
		}
	}
	if len(busy) > 0 {
		return bad
	}
	for _, p := range procs() {
		if p.comm == "terraform" || strings.HasPrefix(p.comm, "terraform-provi") {
			if cwd, _ := os.Readlink("/proc/" + strconv.Itoa(p.pid) + "/cwd"); strings.HasPrefix(cwd, w.dir) {
				bad = append(bad, fmt.Sprintf("%s (pid %d) runs in %s", p.comm, p.pid, cwd))
			}
		}
	}
	return bad
}

// strays returns the processes that run in the world's data dir (their working directory is
// in it) other than kloud, its terraformer and its plugins: machines of the example provider and
// terraform runs; none should be left once every stack is destroyed.
func (w *world) strays() []string {
	ps := procs()
	keep := map[int]bool{w.kloud.Process.Pid: true, w.terraformer(): true}
	parent := map[int]int{}
	for _, p := range ps {
		parent[p.pid] = p.ppid
	}
	// The plugin and the chain of its launcher up to kloud.
	for pid := w.plugin(); pid > 1 && !keep[pid]; pid = parent[pid] {
		keep[pid] = true
	}
	var bad []string
	for _, p := range ps {
		if keep[p.pid] {
			continue
		}
		if cwd, _ := os.Readlink("/proc/" + strconv.Itoa(p.pid) + "/cwd"); cwd == w.dir || strings.HasPrefix(cwd, w.dir+"/") {
			bad = append(bad, fmt.Sprintf("%s (pid %d) runs in %s", p.comm, p.pid, cwd))
		}
	}
	return bad
}

// checkTFLeases: with no job running, no terraformer lease (stacks/*/lease.json of the
// terraformer's data dir) is still held: one would be a run's that nobody runs, keeping the
// stack's next terraform run waiting until it expires.
func (w *world) checkTFLeases() []string {
	files, _ := filepath.Glob(filepath.Join(w.dir, "terraformer", "stacks", "*", "lease.json"))
	var bad []string
	now := time.Now()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // released meanwhile
		}
		var l struct {
			Owner, JobID string
			Expires      time.Time
		}
		if json.Unmarshal(b, &l) == nil && l.Expires.After(now) {
			bad = append(bad, fmt.Sprintf("terraformer lease of %s held by %s (job %s) until %s with no job running",
				filepath.Base(filepath.Dir(f)), l.Owner, l.JobID, l.Expires.Format(time.RFC3339Nano)))
		}
	}
	return bad
}

// invariants runs every check.
func (w *world) invariants() []string {
	busy, bad := w.checkJobs()
	owned, b := w.checkState(busy)
	bad = append(bad, b...)
	if owned != nil {
		bad = append(bad, w.checkHost(owned, busy)...)
	}
	if len(busy) == 0 {
		bad = append(bad, w.checkTFLeases()...)
	}
	return bad
}

// gone returns what is left on the host of machines that should no longer exist: their record,
// directory, network namespace, host veth, cgroup, mounts, or a running PID 1.
func (w *world) gone(infos []sandbox.Info) []string {
	var bad []string
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, in := range infos {
		if got, err := w.h.Manager.Info(w.t.Context(), in.ID); err != nil || got.State != sandbox.StateAbsent {
			bad = append(bad, fmt.Sprintf("machine %s: %s %v", in.ID, got.State, err))
		}
		for dir, name := range map[string]string{"": in.Dir, "/run/netns/": in.Netns, "/sys/class/net/": in.HostVeth} {
			if _, err := os.Lstat(dir + name); name != "" && err == nil {
				bad = append(bad, fmt.Sprintf("machine %s: %s is left", in.ID, dir+name))
			}
		}
		if in.Dir != "" && strings.Contains(string(mounts), in.Dir) {
			bad = append(bad, fmt.Sprintf("machine %s: a mount under %s is left", in.ID, in.Dir))
		}
		if in.Netns != "" {
			cgs, _ := filepath.Glob("/sys/fs/cgroup/*/kloud/" + in.Netns)
			more, _ := filepath.Glob("/sys/fs/cgroup/kloud/" + in.Netns)
			for _, cg := range append(cgs, more...) {
				bad = append(bad, fmt.Sprintf("machine %s: cgroup %s is left", in.ID, cg))
			}
		}
		if in.PID > 0 {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", in.PID)); err == nil && strings.Contains(string(b), "KLOUD_SANDBOX_STAGE=") {
				bad = append(bad, fmt.Sprintf("machine %s: PID 1 %d still runs", in.ID, in.PID))
			}
		}
	}
	return bad
}

// proc is a host process: its pid, parent and command name.
type proc struct {
	pid, ppid int
	comm      string
}

// procs lists the host's processes (from /proc/PID/stat).
func procs() []proc {
	ents, _ := os.ReadDir("/proc")
	var ps []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(s[close+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ps = append(ps, proc{pid: pid, ppid: ppid, comm: s[open+1 : close]})
	}
	return ps
}

// descendants returns the processes under pid (not pid itself).
func descendants(ps []proc, pid int) []proc {
	var out []proc
	parents := map[int]bool{pid: true}
	for grew := true; grew; {
		grew = false
		for _, p := range ps {
			if parents[p.ppid] && !parents[p.pid] {
				parents[p.pid] = true
				out = append(out, p)
				grew = true
			}
		}
	}
	return out
}
