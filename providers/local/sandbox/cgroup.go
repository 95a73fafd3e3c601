package sandbox

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
)

// Cgroups. The machine's PID 1 (and so every process of the machine) joins one cgroup per
// controller it needs, named <hierarchy>/kloud/kd-<manager>-<machine>. Each controller is taken
// from wherever the host has it: a cgroup v1 hierarchy if it is mounted as one (as on the hybrid
// hosts we run on, where memory, cpu and pids are v1 and the unified v2 tree has only hugetlb), or
// else the unified v2 tree if it lists the controller in cgroup.controllers.
//
//	memory  v1 memory.limit_in_bytes       v2 memory.max
//	cpu     v1 cpu.cfs_quota_us/period_us  v2 cpu.max
//	pids    v1 pids.max                    v2 pids.max (always "max": only used to track processes)

// cgroupControllers are the controllers a machine joins.
func cgroupControllers() []string { return []string{"memory", "cpu", "pids"} }

// hierarchy is one mounted cgroup tree.
type hierarchy struct {
	mount string
	v2    bool
}

// cgroupHierarchies maps each available controller to the hierarchy that carries it.
func cgroupHierarchies() (map[string]hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	v1 := map[string]hierarchy{}
	var v2mount string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mountPoint, fstype, superOpts, ok := parseMountinfo(sc.Text())
		if !ok {
			continue
		}
		switch fstype {
		case "cgroup":
			for _, o := range strings.Split(superOpts, ",") {
				if slices.Contains(cgroupControllers(), o) {
					if _, dup := v1[o]; !dup {
						v1[o] = hierarchy{mount: mountPoint}
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
	out := map[string]hierarchy{}
	var v2ctl []string
	if v2mount != "" {
		if b, err := os.ReadFile(filepath.Join(v2mount, "cgroup.controllers")); err == nil {
			v2ctl = strings.Fields(string(b))
		}
	}
	for _, c := range cgroupControllers() {
		if h, ok := v1[c]; ok {
			out[c] = h
		} else if slices.Contains(v2ctl, c) {
			out[c] = hierarchy{mount: v2mount, v2: true}
		}
	}
	return out, nil
}

// parseMountinfo returns the mount point, filesystem type and super options of a mountinfo line.
func parseMountinfo(line string) (mountPoint, fstype, superOpts string, ok bool) {
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

// validMachineCgroup guards every path this package kills processes in or removes: only
// "kloud/kd-..." (never "", a hierarchy root, or anything with "..").
func validMachineCgroup(rel string) bool {
	name, ok := strings.CutPrefix(rel, "kloud/kd-")
	return ok && name != "" && !strings.Contains(name, "/") && !strings.Contains(name, "..")
}

// cgroupDirs returns the distinct cgroup directories of a machine with relative path rel, one
// per hierarchy in use; none for a rel that is not a machine cgroup.
func cgroupDirs(hs map[string]hierarchy, rel string) []string {
	if !validMachineCgroup(rel) {
		return nil
	}
	return hierarchyDirs(hs, rel)
}

func hierarchyDirs(hs map[string]hierarchy, rel string) []string {
	var dirs []string
	for _, c := range cgroupControllers() {
		h, ok := hs[c]
		if !ok {
			continue
		}
		d := filepath.Join(h.mount, rel)
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// setupCgroups creates the machine's cgroups and writes its limits; it returns the cgroup.procs
// files the machine's first process must join.
func setupCgroups(r *record) ([]string, error) {
	if !validMachineCgroup(r.Cgroup) {
		return nil, fmt.Errorf("cgroup %q: not a machine cgroup", r.Cgroup)
	}
	hs, err := cgroupHierarchies()
	if err != nil {
		return nil, err
	}
	if r.MemoryMB > 0 {
		if _, ok := hs["memory"]; !ok {
			return nil, errors.New("memory limit requested but the host has no memory cgroup controller")
		}
	}
	if r.CPUs > 0 {
		if _, ok := hs["cpu"]; !ok {
			return nil, errors.New("cpu limit requested but the host has no cpu cgroup controller")
		}
	}
	for _, c := range cgroupControllers() {
		h, ok := hs[c]
		if !ok {
			continue
		}
		dir := filepath.Join(h.mount, r.Cgroup)
		if h.v2 {
			// Controllers must be enabled in every ancestor's subtree_control.
			parent := h.mount
			for _, part := range strings.Split(filepath.Dir(r.Cgroup), "/") {
				if err := writeCgroup(filepath.Join(parent, "cgroup.subtree_control"), "+"+c); err != nil {
					return nil, err
				}
				parent = filepath.Join(parent, part)
				if err := os.MkdirAll(parent, 0o755); err != nil {
					return nil, fmt.Errorf("create cgroup: %w", err)
				}
			}
			if err := writeCgroup(filepath.Join(parent, "cgroup.subtree_control"), "+"+c); err != nil {
				return nil, err
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		var werr error
		switch {
		case c == "memory" && !h.v2:
			v := "-1"
			if r.MemoryMB > 0 {
				v = strconv.FormatInt(int64(r.MemoryMB)<<20, 10)
			}
			werr = writeCgroup(filepath.Join(dir, "memory.limit_in_bytes"), v)
		case c == "memory":
			v := "max"
			if r.MemoryMB > 0 {
				v = strconv.FormatInt(int64(r.MemoryMB)<<20, 10)
			}
			werr = writeCgroup(filepath.Join(dir, "memory.max"), v)
		case c == "cpu" && !h.v2:
			q := "-1"
			if r.CPUs > 0 {
				q = strconv.FormatInt(int64(r.CPUs*100000), 10)
			}
			werr = errors.Join(writeCgroup(filepath.Join(dir, "cpu.cfs_period_us"), "100000"),
				writeCgroup(filepath.Join(dir, "cpu.cfs_quota_us"), q))
		case c == "cpu":
			v := "max 100000"
			if r.CPUs > 0 {
				v = strconv.FormatInt(int64(r.CPUs*100000), 10) + " 100000"
			}
			werr = writeCgroup(filepath.Join(dir, "cpu.max"), v)
		}
		if werr != nil {
			return nil, werr
		}
	}
	var procs []string
	for _, d := range cgroupDirs(hs, r.Cgroup) {
		procs = append(procs, filepath.Join(d, "cgroup.procs"))
	}
	return procs, nil
}

func writeCgroup(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("cgroup %s=%s: %w", path, value, err)
	}
	return nil
}

// cgroupPIDs lists the processes in the machine's cgroups.
func cgroupPIDs(rel string) []int {
	hs, err := cgroupHierarchies()
	if err != nil {
		return nil
	}
	var pids []int
	for _, d := range cgroupDirs(hs, rel) {
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

// removeCgroups removes the machine's cgroup directories; they must be empty of processes.
func removeCgroups(rel string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range cgroupDirs(hs, rel) {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}

// cgroupOrphans lists the cgroup names (relative paths) under kloud/ that start with prefix.
func cgroupOrphans(prefix string) []string {
	hs, err := cgroupHierarchies()
	if err != nil {
		return nil
	}
	var out []string
	for _, d := range hierarchyDirs(hs, "kloud") {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			rel := "kloud/" + e.Name()
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) && validMachineCgroup(rel) && !slices.Contains(out, rel) {
				out = append(out, rel)
			}
		}
	}
	return out
}
