package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// procStat returns the state letter and start time (clock ticks since boot) of pid.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64) // field 22
	if err != nil {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	return f[0][0], start, nil
}

// alive reports whether pid is still the process that started at start (not a reused PID, not a
// zombie).
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, s, err := procStat(pid)
	return err == nil && s == start && st != 'Z' && st != 'X'
}

// nsInode returns the inode of a namespace file (/proc/PID/ns/net or a /run/netns bind mount).
func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// pidsInNetns lists the host PIDs of all live processes whose network namespace is the one with
// inode ino. This finds every process of a machine, even one whose PID 1 was never recorded
// (a crash between boot and writing machine.json).
func pidsInNetns(ino uint64) []int {
	// Never the host's namespace (this process's): that would be every process on the host.
	if own, err := nsInode("/proc/self/ns/net"); err != nil || own == ino {
		return nil
	}
	if init, err := nsInode("/proc/1/ns/net"); err == nil && init == ino { // may be unreadable
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 || pid == self {
			continue
		}
		i, err := nsInode("/proc/" + e.Name() + "/ns/net")
		if err != nil || i != ino {
			continue
		}
		if st, _, err := procStat(pid); err == nil && st != 'Z' && st != 'X' {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitGone polls until done() or the deadline; it reports whether done() became true.
func waitGone(ctx context.Context, timeout time.Duration, done func() bool) bool {
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for {
		if done() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return done()
		}
		time.Sleep(delay)
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// kill signals one process; pids <= 1 and this process are refused (kill(-1) or kill(0) would hit
// a process group or everything).
func kill(pid int, sig unix.Signal) error {
	if pid <= 1 || pid == os.Getpid() {
		return fmt.Errorf("refusing to signal pid %d", pid)
	}
	err := unix.Kill(pid, sig)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}
