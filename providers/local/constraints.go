package local

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/kloud-dev/kloud/provider"
)

// Constraints of local machines: what a kloudlocal_machine may ask for on this host, checked at
// plan time (kloud calls the stack's ValidateConstraints for every planned machine) and enforced
// when the machine runs: memory and cpus by cgroups (memory.max, cpu.max).
//
//	cores  cpus     number   0.01 up to the host's CPUs
//	mem    memory   integer  32 MB up to the host's memory (MB = MiB, as the attribute)
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
		{Name: provider.ConstraintArch, Type: provider.ConstraintString, Values: []string{runtime.GOARCH},
			Description: "the host's architecture (machines share its kernel)"},
		{Name: provider.ConstraintTags, Attribute: "tags", Type: provider.ConstraintMap,
			Description: "tags kept with the machine; kloud adds kloud_stack and kloud_machine"},
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
