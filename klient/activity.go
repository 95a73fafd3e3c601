package klient

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
)

// klient.activity (klientapi.Activity): the CPU time of the processes klient started, for
// kloud's idle stop. kloud sees terminals and port forwards itself; a build left running in a
// detached terminal it sees only through this.

// userHZ is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

func (kl *Klient) handleActivity() {
	kl.kite.HandleFunc(klientapi.MethodActivity, kl.activity)
}

func (kl *Klient) activity(ctx context.Context, r *kite.Request) (any, error) {
	if !r.Conn.Dialed() {
		return nil, fmt.Errorf("%s: only kloud, on the connection klient dialed, asks: %w", r.Method, kite.ErrPermission)
	}
	// Terminal sessions a klient before this one started live in holders that are no longer
	// klient's descendants: theirs count too.
	ticks, n, err := descendantsCPU(os.Getpid(), kl.term.AdoptedHolders()...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Method, err)
	}
	return klientapi.Activity{CPUSeconds: float64(ticks) / userHZ, Processes: n, At: time.Now().UTC()}, nil
}

// procTimes are a process's fields of /proc/PID/stat that descendantsCPU needs.
type procTimes struct {
	ppid                 int
	self, reapedChildren uint64 // utime+stime, cutime+cstime (clock ticks)
}

// readProcTimes parses /proc/PID/stat.
func readProcTimes(pid int) (procTimes, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procTimes{}, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procTimes{}, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3 (state)
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	var v [5]uint64 // ppid (field 4), utime, stime, cutime, cstime (fields 14-17)
	for j, field := range []int{4, 14, 15, 16, 17} {
		n, err := strconv.ParseInt(f[field-3], 10, 64)
		if err != nil {
			return procTimes{}, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
		}
		v[j] = uint64(max(n, 0))
	}
	return procTimes{ppid: int(v[0]), self: v[1] + v[2], reapedChildren: v[3] + v[4]}, nil
}

// descendantsCPU sums the CPU time (clock ticks) of the descendants of root and of more (those
// of more that are gone are skipped), living and reaped, and counts the living ones.
func descendantsCPU(root int, more ...int) (ticks uint64, n int, err error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, err
	}
	procs := map[int]procTimes{}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pt, err := readProcTimes(pid)
		if err != nil {
			continue // gone meanwhile
		}
		procs[pid] = pt
		children[pt.ppid] = append(children[pt.ppid], pid)
	}
	self, ok := procs[root]
	if !ok {
		return 0, 0, fmt.Errorf("klient's own process %d is not in /proc", root)
	}
	ticks = self.reapedChildren
	queue := append([]int(nil), children[root]...)
	for _, pid := range more {
		if pt, ok := procs[pid]; ok && pid != root {
			ticks += pt.reapedChildren
			queue = append(queue, children[pid]...)
		}
	}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		pt := procs[pid]
		ticks += pt.self + pt.reapedChildren
		n++
		queue = append(queue, children[pid]...)
	}
	return ticks, n, nil
}
