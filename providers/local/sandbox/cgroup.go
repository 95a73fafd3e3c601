package sandbox

import (
	"fmt"
	"strings"

	"github.com/kloud-dev/kloud/internal/cgroups"
)

// Cgroups. The machine's PID 1 (and so every process of the machine) joins one cgroup per
// controller (memory, cpu, pids), named <hierarchy>/kloud/kd-<manager>-<machine>, through
// internal/cgroups (v1, v2 or hybrid hosts). Spec.MemoryMB, CPUs and PidsMax are its limits.

// validMachineCgroup guards every path this package kills processes in or removes: only
// "kloud/kd-..." (never "", a hierarchy root, or anything with "..").
func validMachineCgroup(rel string) bool {
	name, ok := strings.CutPrefix(rel, "kloud/kd-")
	return ok && name != "" && cgroups.Valid(rel)
}

// cgroupDirs returns the distinct cgroup directories of a machine with relative path rel, one
// per hierarchy in use; none for a rel that is not a machine cgroup.
func cgroupDirs(hs map[string]cgroups.Hierarchy, rel string) []string {
	if !validMachineCgroup(rel) {
		return nil
	}
	return cgroups.Dirs(hs, rel)
}

// setupCgroups creates the machine's cgroups and writes its limits; it returns the cgroup.procs
// files the machine's first process must join.
func setupCgroups(r *record) ([]string, error) {
	if !validMachineCgroup(r.Cgroup) {
		return nil, fmt.Errorf("cgroup %q: not a machine cgroup", r.Cgroup)
	}
	pids := r.PidsMax
	switch {
	case pids == 0: // a record from before pids limits
		pids = DefaultPidsMax
	case pids < 0:
		pids = 0
	}
	return cgroups.Create(r.Cgroup, cgroups.Limits{MemoryBytes: int64(r.MemoryMB) << 20, CPUs: r.CPUs, PidsMax: pids})
}

// cgroupPIDs lists the processes in the machine's cgroups.
func cgroupPIDs(rel string) []int {
	if !validMachineCgroup(rel) {
		return nil
	}
	return cgroups.PIDs(rel)
}

// removeCgroups removes the machine's cgroup directories; they must be empty of processes.
func removeCgroups(rel string) error {
	if !validMachineCgroup(rel) {
		return nil
	}
	return cgroups.Remove(rel)
}

// cgroupOrphans lists the machine cgroup names (relative paths) under kloud/ that start with
// prefix.
func cgroupOrphans(prefix string) []string {
	var out []string
	for _, rel := range cgroups.Orphans(prefix) {
		if validMachineCgroup(rel) {
			out = append(out, rel)
		}
	}
	return out
}
