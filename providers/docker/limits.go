package docker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// A machine's limits as its own tools see them, as on local machines (providers/local/sandbox
// limits.go, docs/providers.md "Constraints"): Docker's cgroups enforce `memory` and `cpus`, but
// free(1) reads /proc/meminfo and nproc(1) the CPU affinity, which show the host's, and the
// container has no right to change its own mounts (no CAP_SYS_ADMIN; the proxy allows no bind
// mount). So kloud, on the daemon's host and as root (where the firewall works too), does it from
// outside when a container has started (the proxy's start and restart, Start, the daemon's start
// events while Watch runs):
//
//   - the CPU affinity of every thread in the container is restricted to the first ceil(cpus)
//     CPUs it may use; what they start inherits it (the agent, the terminals), so nproc says
//     ceil(cpus). A `docker exec` comes from the daemon with the container's full set, as an Exec
//     of a local machine comes with the host's;
//   - a generated /proc/meminfo (sandbox.MemInfo: MemTotal is the memory limit) and a matching
//     /sys/devices/system/cpu/online (nproc --all) are bind-mounted read-only over the
//     container's, from files in its /dev/.kloud (the container's own tmpfs), by a thread of
//     kloud's that enters the container's mount namespace only (setns: no binary of the
//     container runs with kloud's rights, and every path resolves inside the container's root;
//     nsWorker).
//
// They are written at start, and again after an update of the container's limits through the
// proxy: free shows the limit as the total, not live usage. Without a local daemon or root
// nothing is done and the tools show the host's.

// limitsAfterStart is showLimits, whose failure is said and otherwise ignored: the machine
// runs, its tools show the host's numbers.
func (d *Docker) limitsAfterStart(ctx context.Context, id string) {
	if err := d.showLimits(ctx, id); err != nil {
		d.log.Warn("docker provider: the machine's limits as its tools see them (nproc, free)", "container", id, "err", err)
	}
}

// limitsDir is where the generated files are, in the container.
const limitsDir = "/dev/.kloud"

// showLimits makes container id's limits what its tools see (above). It does nothing for a
// container without limits, or where kloud cannot (limitsWhy).
func (d *Docker) showLimits(ctx context.Context, id string) error {
	if d.limitsWhy != "" {
		return nil
	}
	cli, err := d.Client()
	if err != nil {
		return err
	}
	res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	c := res.Container
	if c.State == nil || !c.State.Running || c.State.Pid <= 0 || c.HostConfig == nil {
		return nil
	}
	cpus := float64(c.HostConfig.NanoCPUs) / 1e9
	if cpus == 0 && c.HostConfig.CPUQuota > 0 && c.HostConfig.CPUPeriod > 0 {
		cpus = float64(c.HostConfig.CPUQuota) / float64(c.HostConfig.CPUPeriod)
	}
	mem := c.HostConfig.Memory
	if cpus <= 0 && mem <= 0 {
		return nil
	}
	pid := c.State.Pid
	if err := notOurs(pid, "mnt"); err != nil {
		return err
	}
	var online []byte
	if cpus > 0 {
		n, err := limitAffinity(pid, cpus, c.HostConfig.CpusetCpus)
		if err != nil {
			return err
		}
		online = []byte("0\n")
		if n > 1 {
			online = fmt.Appendf(nil, "0-%d\n", n-1)
		}
	}
	var meminfo []byte
	if mem > 0 {
		host, err := os.ReadFile("/proc/meminfo")
		if err != nil {
			return fmt.Errorf("limits: %w", err)
		}
		meminfo = sandbox.MemInfo(host, mem>>10)
	}
	return d.ns.inMountNS(ctx, pid, func() error {
		// The container's root may have made anything of /dev/.kloud: a directory, no link.
		if err := os.Mkdir(limitsDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if st, err := os.Lstat(limitsDir); err != nil || !st.IsDir() {
			return fmt.Errorf("%s is not a directory (%v)", limitsDir, err)
		}
		for _, f := range []struct {
			name, target string
			data         []byte
		}{{"meminfo", "/proc/meminfo", meminfo}, {"cpu-online", "/sys/devices/system/cpu/online", online}} {
			if f.data == nil {
				continue
			}
			if err := bindFile(filepath.Join(limitsDir, f.name), f.target, f.data); err != nil {
				return err
			}
		}
		return nil
	})
}

// bindFile writes data to src and bind-mounts it read-only over target, unless it is bound there
// already (a second start hook for one start): then the content is rewritten in place.
func bindFile(src, target string, data []byte) error {
	var st, tst unix.Stat_t
	bound := unix.Stat(src, &st) == nil && unix.Stat(target, &tst) == nil && st.Dev == tst.Dev && st.Ino == tst.Ino
	fd, err := unix.Open(src, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return fmt.Errorf("write %s: %w", src, err)
	}
	f := os.NewFile(uintptr(fd), src)
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", src, err)
	}
	if bound {
		return nil
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", target, err)
	}
	return nil
}

// nsWorker runs functions in other mount namespaces on one OS thread of its own, locked to its
// goroutine for the process's life: a thread that enters another mount namespace cannot be handed
// back to Go's scheduler (its root and working directory are no longer the process's), and one
// that exits would kill the children forked from it earlier with a parent-death signal (the
// terraform sandbox's launcher is such a child: golang/go#27505). Go creates no thread from a
// locked one (it asks its template thread), so nothing inherits this thread's state.
type nsWorker struct {
	once sync.Once
	reqs chan nsReq
}

type nsReq struct {
	pid  int
	fn   func() error
	done chan error
}

// inMountNS runs fn on the worker's thread in the mount namespace of pid (its root and working
// directory the namespace's root: every path resolves inside it), then returns the thread to
// kloud's own mount namespace.
func (w *nsWorker) inMountNS(ctx context.Context, pid int, fn func() error) error {
	w.once.Do(func() {
		w.reqs = make(chan nsReq)
		ready := make(chan struct{})
		go w.run(ready)
		<-ready
	})
	req := nsReq{pid: pid, fn: fn, done: make(chan error, 1)}
	select {
	case w.reqs <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := <-req.done; err != nil {
		return fmt.Errorf("limits: container process %d: %w", pid, err)
	}
	return nil
}

func (w *nsWorker) run(ready chan<- struct{}) {
	runtime.LockOSThread() // never unlocked (above)
	// The thread's own root and working directory, and a way back to kloud's mount namespace.
	errFS := unix.Unshare(unix.CLONE_FS)
	home, errHome := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	close(ready)
	broken := errors.Join(errFS, errHome)
	for req := range w.reqs {
		if broken != nil {
			req.done <- fmt.Errorf("kloud's mount namespace thread: %w", broken)
			continue
		}
		err := func() error {
			fd, err := unix.Open("/proc/"+strconv.Itoa(req.pid)+"/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("setns: %w", err)
			}
			return req.fn()
		}()
		// Home again (also after a failed fn): kloud's namespace and its root as working
		// directory; if that fails the thread is unusable from now on.
		if err := unix.Setns(home, unix.CLONE_NEWNS); err != nil {
			broken = fmt.Errorf("setns back: %w", err)
		} else if err := unix.Chdir("/"); err != nil {
			broken = fmt.Errorf("chdir: %w", err)
		}
		req.done <- errors.Join(err, broken)
	}
}

// notOurs checks that pid is in another namespace of kind (mnt, pid, net) than kloud: a
// container's process, not a reused pid of the host's.
func notOurs(pid int, kind string) error {
	var self, its unix.Stat_t
	if err := unix.Stat("/proc/self/ns/"+kind, &self); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/"+kind, &its); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if self.Ino == its.Ino && self.Dev == its.Dev {
		return fmt.Errorf("limits: process %d is in kloud's %s namespace: not a container's", pid, kind)
	}
	return nil
}

// limitAffinity restricts every thread of every process in the pid namespace of pid (the
// container's) to the first ceil(cpus) CPUs the container may use (its cpuset, a list such as
// "0-3,6"; without one kloud's own), and returns that count. Passes repeat until one finds
// nothing new: a thread forked meanwhile from one already restricted inherits the restriction,
// one forked from one not yet restricted is found by the next pass.
func limitAffinity(pid int, cpus float64, cpuset string) (int, error) {
	if err := notOurs(pid, "pid"); err != nil {
		return 0, err
	}
	var cur, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cur); err != nil {
		return 0, fmt.Errorf("limits: sched_getaffinity: %w", err)
	}
	if cpuset != "" {
		if cs, ok := parseCPUList(cpuset); ok && cs.Count() > 0 {
			cur = cs
		}
	}
	n := min(max(int(math.Ceil(cpus)), 1), cur.Count())
	for cpu := 0; cpu < len(cur)*64 && set.Count() < n; cpu++ {
		if cur.IsSet(cpu) {
			set.Set(cpu)
		}
	}
	var ns unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/pid", &ns); err != nil {
		return 0, fmt.Errorf("limits: %w", err)
	}
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		found := false
		procs, err := os.ReadDir("/proc")
		if err != nil {
			return 0, fmt.Errorf("limits: %w", err)
		}
		for _, p := range procs {
			if _, err := strconv.Atoi(p.Name()); err != nil {
				continue
			}
			var st unix.Stat_t
			if unix.Stat("/proc/"+p.Name()+"/ns/pid", &st) != nil || st.Ino != ns.Ino || st.Dev != ns.Dev {
				continue
			}
			tasks, _ := os.ReadDir("/proc/" + p.Name() + "/task")
			for _, t := range tasks {
				tid, err := strconv.Atoi(t.Name())
				if err != nil || done[tid] {
					continue
				}
				found = true
				if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
					return 0, fmt.Errorf("limits: sched_setaffinity %d: %w", tid, err)
				}
				done[tid] = true
			}
		}
		if !found {
			break
		}
	}
	return n, nil
}

// parseCPUList parses a cpuset list ("0-3,6").
func parseCPUList(s string) (unix.CPUSet, bool) {
	var set unix.CPUSet
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return set, false
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return set, false
			}
		}
		for cpu := a; cpu <= b && cpu < len(set)*64; cpu++ {
			set.Set(cpu)
		}
	}
	return set, true
}
