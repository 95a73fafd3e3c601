// Package measure holds the small helpers the benchmarks share: latency percentiles, medians
// over rounds and a process's memory as the kernel reports it.
package measure

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Latency summarises a set of durations.
type Latency struct {
	N                  int
	P50, P90, P99, Max time.Duration
	Mean               time.Duration
}

// Summarize sorts d in place and returns its percentiles (nearest rank).
func Summarize(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	slices.Sort(d)
	var sum time.Duration
	for _, v := range d {
		sum += v
	}
	return Latency{
		N: len(d), P50: Percentile(d, 50), P90: Percentile(d, 90), P99: Percentile(d, 99),
		Max: d[len(d)-1], Mean: sum / time.Duration(len(d)),
	}
}

// Percentile returns the p-th percentile (nearest rank) of sorted.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Median returns the median of v (the mean of the middle two for an even count).
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// MedianDuration is Median for durations.
func MedianDuration(v []time.Duration) time.Duration {
	f := make([]float64, len(v))
	for i, d := range v {
		f[i] = float64(d)
	}
	return time.Duration(Median(f))
}

// Ms formats d in milliseconds with three decimals.
func Ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }

// Us formats d in microseconds with one decimal.
func Us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

// MiB formats a byte count in MiB.
func MiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// ProcStatus is what /proc/<pid>/status says about a process's memory and threads.
type ProcStatus struct {
	VmRSS, VmHWM int64 // bytes
	Threads      int
}

// ReadProcStatus reads /proc/<pid>/status.
func ReadProcStatus(pid int) (ProcStatus, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcStatus{}, fmt.Errorf("proc status: %w", err)
	}
	defer f.Close()
	var s ProcStatus
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			s.VmRSS = n << 10
		case "VmHWM":
			s.VmHWM = n << 10
		case "Threads":
			s.Threads = int(n)
		}
	}
	if err := sc.Err(); err != nil {
		return ProcStatus{}, fmt.Errorf("proc status: %w", err)
	}
	return s, nil
}

// CPUModel returns the first "model name" of /proc/cpuinfo.
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// LoadAvg returns the first three fields of /proc/loadavg ("1.02 0.87 0.55"); the benchmarks
// print it because other work on the machine moves their figures.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// CPUTime returns the user+system CPU time this process has used so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ProcCPUTime returns the user+system CPU time process pid has used (from /proc/<pid>/stat,
// in clock ticks of 10 ms).
func ProcCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("proc stat: %w", err)
	}
	// The command name (field 2) may hold spaces; the fields after its closing paren are fixed.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat: no command name in %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields", len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14 of the whole line
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("proc stat: bad utime/stime %q %q", f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}
