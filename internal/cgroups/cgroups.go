// Package cgroups puts processes under cgroup limits (cpu, memory, pids) on cgroup v1, v2 or a
// hybrid of both: each controller is taken from wherever the host has it, a v1 hierarchy if it is
// mounted as one (as on the hybrid hosts we run on, where memory, cpu and pids are v1 and the
// unified v2 tree has only hugetlb), or else the unified v2 tree if it lists the controller in
// cgroup.controllers. A group is one directory per hierarchy in use, all at the same path
// relative to the hierarchy roots, always under "kloud/" (see [Valid]).
//
//	memory  v1 memory.limit_in_bytes       v2 memory.max
//	cpu     v1 cpu.cfs_quota_us/period_us  v2 cpu.max
//	pids    v1 pids.max                    v2 pids.max
//
// Users: the local provider's machines (providers/local/sandbox, kloud/kd-<mgr>-<id>), terraform
// runs and provider plugins (terraformer/tfsandbox, kloud/tf-<run> and kloud/kp-<run>).
package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Limits of a group; zero means unlimited.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	PidsMax     int     `json:"pids_max,omitempty"`
}

// Controllers are the controllers a group joins.
func Controllers() []string { return []string{"memory", "cpu", "pids"} }

// Hierarchy is one mounted cgroup tree.
type Hierarchy struct {
	Mount string
	V2    bool
}

// Hierarchies maps each available controller to the hierarchy that carries it.
func Hierarchies() (map[string]Hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	v1 := map[string]Hierarchy{}
	var v2mount string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mountPoint, fstype, superOpts, ok := ParseMountinfo(sc.Text())
		if !ok {
			continue
		}
		switch fstype {
		case "cgroup":
			for _, o := range strings.Split(superOpts, ",") {
				if slices.Contains(Controllers(), o) {
					if _, dup := v1[o]; !dup {
						v1[o] = Hierarchy{Mount: mountPoint}
					}
				}
			}
		case "cgroup2":
			if v2mount == "" {
				v2mount = mountPoint
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	out := map[string]Hierarchy{}
	var v2ctl []string
	if v2mount != "" {
		if b, err := os.ReadFile(filepath.Join(v2mount, "cgroup.controllers")); err == nil {
			v2ctl = strings.Fields(string(b))
		}
	}
	for _, c := range Controllers() {
		if h, ok := v1[c]; ok {
			out[c] = h
		} else if slices.Contains(v2ctl, c) {
			out[c] = Hierarchy{Mount: v2mount, V2: true}
		}
	}
	return out, nil
}

// ParseMountinfo returns the mount point, filesystem type and super options of a line of
// /proc/*/mountinfo.
func ParseMountinfo(line string) (mountPoint, fstype, superOpts string, ok bool) {
	pre, post, found := strings.Cut(line, " - ")
	if !found {
		return "", "", "", false
	}
	a, b := strings.Fields(pre), strings.Fields(post)
	if len(a) < 5 || len(b) < 3 {
		return "", "", "", false
	}
	return unescapeMountinfo(a[4]), b[0], b[2], true
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Valid guards every path this package creates, kills processes in or removes: only
// "kloud/<name>" with a non-empty name of one element (never "", a hierarchy root, "kloud" itself
// or anything with "..").
func Valid(rel string) bool {
	name, ok := strings.CutPrefix(rel, "kloud/")
	return ok && name != "" && !strings.Contains(name, "/") && !strings.Contains(name, "..")
}

// Dirs returns the distinct directories of group rel, one per hierarchy in use; none for a rel
// that is not [Valid].
func Dirs(hs map[string]Hierarchy, rel string) []string {
	if !Valid(rel) {
		return nil
	}
	return hierarchyDirs(hs, rel)
}

func hierarchyDirs(hs map[string]Hierarchy, rel string) []string {
	var dirs []string
	for _, c := range Controllers() {
		h, ok := hs[c]
		if !ok {
			continue
		}
		d := filepath.Join(h.Mount, rel)
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// Age is how long ago group rel was made: the youngest of its directories' change times (0 when
// it has none, or rel is not a kloud group).
func Age(rel string) time.Duration {
	hs, err := Hierarchies()
	if err != nil {
		return 0
	}
	var age time.Duration = -1
	for _, d := range Dirs(hs, rel) {
		var st syscall.Stat_t
		if syscall.Stat(d, &st) != nil {
			continue
		}
		a := time.Since(time.Unix(st.Ctim.Unix()))
		if age < 0 || a < age {
			age = a
		}
	}
	return max(age, 0)
}

// Create creates group rel in every hierarchy in use and writes its limits (unlimited where a
// limit is zero); it returns the cgroup.procs files a process must join (see [Join]). A limit the
// host has no controller for is an error.
func Create(rel string, l Limits) ([]string, error) {
	if !Valid(rel) {
		return nil, fmt.Errorf("cgroup %q: not a kloud cgroup", rel)
	}
	hs, err := Hierarchies()
	if err != nil {
		return nil, err
	}
	for c, set := range map[string]bool{"memory": l.MemoryBytes > 0, "cpu": l.CPUs > 0, "pids": l.PidsMax > 0} {
		if _, ok := hs[c]; set && !ok {
			return nil, fmt.Errorf("%s limit requested but the host has no %s cgroup controller", c, c)
		}
	}
	for _, c := range Controllers() {
		h, ok := hs[c]
		if !ok {
			continue
		}
		dir := filepath.Join(h.Mount, rel)
		if h.V2 {
			// Controllers must be enabled in every ancestor's subtree_control.
			parent := h.Mount
			for _, part := range strings.Split(filepath.Dir(rel), "/") {
				if err := write(filepath.Join(parent, "cgroup.subtree_control"), "+"+c); err != nil {
					return nil, err
				}
				parent = filepath.Join(parent, part)
				if err := os.MkdirAll(parent, 0o755); err != nil {
					return nil, fmt.Errorf("create cgroup: %w", err)
				}
			}
			if err := write(filepath.Join(parent, "cgroup.subtree_control"), "+"+c); err != nil {
				return nil, err
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		var werr error
		switch {
		case c == "memory" && !h.V2:
			v := "-1"
			if l.MemoryBytes > 0 {
				v = strconv.FormatInt(l.MemoryBytes, 10)
			}
			werr = write(filepath.Join(dir, "memory.limit_in_bytes"), v)
		case c == "memory":
			v := "max"
			if l.MemoryBytes > 0 {
				v = strconv.FormatInt(l.MemoryBytes, 10)
			}
			werr = write(filepath.Join(dir, "memory.max"), v)
		case c == "cpu" && !h.V2:
			q := "-1"
			if l.CPUs > 0 {
				q = strconv.FormatInt(int64(l.CPUs*100000), 10)
			}
			werr = errors.Join(write(filepath.Join(dir, "cpu.cfs_period_us"), "100000"),
				write(filepath.Join(dir, "cpu.cfs_quota_us"), q))
		case c == "cpu":
			v := "max 100000"
			if l.CPUs > 0 {
				v = strconv.FormatInt(int64(l.CPUs*100000), 10) + " 100000"
			}
			werr = write(filepath.Join(dir, "cpu.max"), v)
		case c == "pids":
			v := "max"
			if l.PidsMax > 0 {
				v = strconv.Itoa(l.PidsMax)
			}
			werr = write(filepath.Join(dir, "pids.max"), v)
		}
		if werr != nil {
			return nil, werr
		}
	}
	var procs []string
	for _, d := range Dirs(hs, rel) {
		procs = append(procs, filepath.Join(d, "cgroup.procs"))
	}
	return procs, nil
}

// Join moves process pid (0: this process, all its threads) into the cgroup.procs files procs.
func Join(procs []string, pid int) error {
	if pid == 0 {
		pid = os.Getpid()
	}
	for _, p := range procs {
		if err := write(p, strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	return nil
}

// Leave moves this process back to the root group of every hierarchy in use (so that its own
// group can be removed).
func Leave() error {
	hs, err := Hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range hierarchyDirs(hs, ".") {
		errs = append(errs, write(filepath.Join(d, "cgroup.procs"), strconv.Itoa(os.Getpid())))
	}
	return errors.Join(errs...)
}

func write(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("cgroup %s=%s: %w", path, value, err)
	}
	return nil
}

// PIDs lists the processes in group rel (never this process or PID 1).
func PIDs(rel string) []int {
	hs, err := Hierarchies()
	if err != nil {
		return nil
	}
	var pids []int
	for _, d := range Dirs(hs, rel) {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil && p > 1 && p != os.Getpid() && !slices.Contains(pids, p) {
				pids = append(pids, p)
			}
		}
	}
	return pids
}

// KillAll sends SIGKILL to every process of group rel, again until none is left (a fork bomb
// keeps forking while it is being killed) or timeout passes; it says whether the group is empty.
func KillAll(rel string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		pids := PIDs(rel)
		if len(pids) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Remove removes the directories of group rel; it must be empty of processes. A group whose
// processes have just died may be busy for a moment: Remove retries for a second.
func Remove(rel string) error {
	hs, err := Hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range Dirs(hs, rel) {
		var err error
		for i := 0; i < 50; i++ {
			if err = os.Remove(d); err == nil || errors.Is(err, fs.ErrNotExist) || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Orphans lists the groups (relative paths) under kloud/ whose names start with prefix.
func Orphans(prefix string) []string {
	hs, err := Hierarchies()
	if err != nil {
		return nil
	}
	var out []string
	for _, d := range hierarchyDirs(hs, "kloud") {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			rel := "kloud/" + e.Name()
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) && Valid(rel) && !slices.Contains(out, rel) {
				out = append(out, rel)
			}
		}
	}
	return out
}
