package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A machine's limits as its own tools see them, without a daemon (no lxcfs): cgroups enforce
// memory and cpus, but free(1) reads /proc/meminfo and nproc(1) the CPU affinity, which show the
// host's. So, when the machine has limits, init
//
//   - bind-mounts a generated /proc/meminfo (read-only) whose MemTotal is the memory limit and
//     whose MemFree and MemAvailable are the limit capped by the host's at boot. It is written
//     once at boot: free shows the limit as the total, not the machine's live usage (the cgroup's
//     memory.current has that);
//   - restricts its own CPU affinity, inherited by every process of the machine, to the first
//     ceil(cpus) CPUs it may use, so nproc and sched_getaffinity say ceil(cpus) (the cgroup quota
//     still bounds the time they get), and bind-mounts a matching
//     /sys/devices/system/cpu/online (nproc --all, sysconf).
//
// The generated files live in /dev/.kloud (init's own tmpfs), read-only.

// limitsDir is where init writes the generated files, relative to the machine's root.
const limitsDir = "dev/.kloud"

// showLimits writes and mounts the machine's view of its limits under root (before the pivot;
// /proc and /sys are mounted).
func showLimits(cfg *bootConfig, root string) error {
	if cfg.MemoryMB <= 0 && cfg.CPUs <= 0 {
		return nil
	}
	dir := filepath.Join(root, limitsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	bind := func(name string, data []byte, target string) error {
		src := filepath.Join(dir, name)
		if err := os.WriteFile(src, data, 0o444); err != nil {
			return fmt.Errorf("limits: %w", err)
		}
		dst := filepath.Join(root, target)
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("limits: bind %s on /%s: %w", src, target, err)
		}
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("limits: remount /%s read-only: %w", target, err)
		}
		return nil
	}
	if cfg.MemoryMB > 0 {
		host, err := os.ReadFile("/proc/meminfo")
		if err != nil {
			return fmt.Errorf("limits: %w", err)
		}
		if err := bind("meminfo", MemInfo(host, int64(cfg.MemoryMB)<<10), "proc/meminfo"); err != nil {
			return err
		}
	}
	if cfg.CPUs > 0 {
		n := cpuCount(cfg.CPUs)
		online := "0\n"
		if n > 1 {
			online = fmt.Sprintf("0-%d\n", n-1)
		}
		if err := bind("cpu-online", []byte(online), "sys/devices/system/cpu/online"); err != nil {
			return err
		}
	}
	return nil
}

// cpuCount is how many CPUs a machine limited to cpus sees: ceil(cpus), at least 1, at most the
// CPUs this process may use.
func cpuCount(cpus float64) int {
	n := max(int(math.Ceil(cpus)), 1)
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err == nil && set.Count() > 0 {
		n = min(n, set.Count())
	}
	return n
}

// limitAffinity restricts the calling thread (init's locked thread, from which every process of
// the machine is forked) to the first cpuCount(cpus) CPUs it may use.
func limitAffinity(cpus float64) error {
	if cpus <= 0 {
		return nil
	}
	var cur, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cur); err != nil {
		return fmt.Errorf("limits: sched_getaffinity: %w", err)
	}
	n := cpuCount(cpus)
	for cpu := 0; cpu < len(cur)*64 && set.Count() < n; cpu++ {
		if cur.IsSet(cpu) {
			set.Set(cpu)
		}
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("limits: sched_setaffinity: %w", err)
	}
	return nil
}

// MemInfo rewrites the host's /proc/meminfo for a machine of limitKB: MemTotal is the limit,
// MemFree and MemAvailable the host's capped by it, the page cache and swap zero (free computes
// "used" as total minus free, buffers and cache: the host's cache would make it negative).
func MemInfo(host []byte, limitKB int64) []byte {
	var b bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(host))
	for sc.Scan() {
		line := sc.Text()
		key, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil || !strings.HasSuffix(rest, "kB") {
			continue // HugePages_* counts: the host's, left out
		}
		switch key {
		case "MemTotal":
			kb = limitKB
		case "MemFree", "MemAvailable":
			kb = min(kb, limitKB)
		case "Buffers", "Cached", "SwapCached", "Active", "Inactive", "Active(anon)", "Inactive(anon)",
			"Active(file)", "Inactive(file)", "Shmem", "SReclaimable", "SUnreclaim", "Slab",
			"SwapTotal", "SwapFree", "Dirty", "Writeback", "AnonPages", "Mapped", "KReclaimable":
			kb = 0
		default:
			continue
		}
		fmt.Fprintf(&b, "%-16s%8d kB\n", key+":", kb)
	}
	return b.Bytes()
}
