package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// Constraints of local machines: what a kloudlocal_machine may ask for on this host, checked at
// plan time (kloud calls the stack's ValidateConstraints for every planned machine) and enforced
// when the machine runs: memory and cpus by cgroups (memory.max, cpu.max), disk_mb by the size of
// the filesystem of its writable layer; free and nproc inside show memory and cpus (sandbox/limits.go).
//
//	cores  cpus     number   0.01 up to the host's CPUs
//	mem    memory   integer  32 MB up to the host's memory (MB = MiB, as the attribute)
//	disk   disk_mb  integer  64 MB up to the free space of the state dir's filesystem: a quota
//	                         on the machine's writable layer (sandbox: an ext4 image; df shows it)
//	arch   -        the host's (machines run the host's kernel)
//	tags   tags     map of strings (kloud adds kloud_stack and kloud_machine)

// Constraints returns the local provider's constraints vocabulary for this host.
func (l *Local) Constraints() []provider.Constraint {
	cpus := float64(runtime.NumCPU())
	vocab := []provider.Constraint{
		{Name: provider.ConstraintCores, Attribute: "cpus", Type: provider.ConstraintNumber, Unit: "CPUs",
			Min: provider.Bounds(0.01), Max: provider.Bounds(cpus), Bound: "this host",
			Description: "CPU limit (cgroup quota); unset: unlimited"},
		{Name: provider.ConstraintMem, Attribute: "memory", Type: provider.ConstraintInteger, Unit: "MB",
			Min: provider.Bounds(32), Bound: "this host",
			Description: "memory limit in MiB (cgroup); unset: unlimited"},
		{Name: provider.ConstraintDisk, Attribute: "disk_mb", Type: provider.ConstraintInteger, Unit: "MB",
			Min: provider.Bounds(sandbox.MinDiskMB), Bound: "this host's free disk",
			Description: "disk quota of the machine's writable layer in MiB (df inside shows it); unset: none"},
		{Name: provider.ConstraintArch, Type: provider.ConstraintString, Values: []string{runtime.GOARCH},
			Description: "the host's architecture (machines share its kernel)"},
		{Name: provider.ConstraintTags, Attribute: "tags", Type: provider.ConstraintMap,
			Description: "tags kept with the machine; kloud adds kloud_stack and kloud_machine"},
	}
	if mb, err := freeDiskMB(l.stateDir); err == nil {
		vocab[2].Max = provider.Bounds(float64(max(mb, sandbox.MinDiskMB)))
	} else {
		l.log.Warn("local provider: free disk unknown; disk_mb is not bounded above", "err", err)
	}
	if mb, err := hostMemoryMB(); err == nil {
		vocab[1].Max = provider.Bounds(float64(mb))
	} else {
		l.log.Warn("local provider: host memory unknown; memory is not bounded above", "err", err)
	}
	return vocab
}

// ValidateConstraints checks a kloudlocal_machine's planned attributes against Constraints.
func (s *stack) ValidateConstraints(ctx context.Context, attrs map[string]any) error {
	return provider.ValidateConstraints(s.l.Constraints(), attrs)
}

var _ provider.ConstraintsValidator = (*stack)(nil)

// hostMemoryMB is the host's MemTotal in MiB.
func hostMemoryMB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemTotal %q: %w", rest, err)
			}
			return kb / 1024, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/meminfo has no MemTotal")
}

// freeDiskMB is the space unprivileged writers have on the filesystem of dir (or of its nearest
// existing parent), in MiB.
func freeDiskMB(dir string) (int64, error) {
	for {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if err == nil {
			return int64(st.Bavail) * st.Bsize >> 20, nil
		}
		parent := filepath.Dir(dir)
		if !errors.Is(err, unix.ENOENT) || parent == dir {
			return 0, fmt.Errorf("statfs %s: %w", dir, err)
		}
		dir = parent
	}
}
