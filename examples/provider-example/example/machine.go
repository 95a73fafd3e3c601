package example

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
	"github.com/kloud-dev/kloud/userdata"
)

// machine is what the provider does for one machine (provider.Machine). kloud builds one per
// operation from a BaseMachine (the machine's id, label, stack, owner, Terraform attributes).
type machine struct {
	e *example
	b *provider.BaseMachine
}

// dir is a machine's disk.
func (e *example) dir(stackID, label string) string {
	return filepath.Join(e.o.Dir, "machines", stackID, label)
}

func (m *machine) dir() string { return m.e.dir(m.b.StackID, m.b.Label) }

// Info reports what really is (kloud believes it over its own records): no disk is Terminated,
// a disk with its agent's supervisor alive is Running, a disk without is Stopped (stopped, or
// its processes died, e.g. with a restarted plugin).
func (m *machine) Info(ctx context.Context) (provider.State, any, error) {
	if !plugin.ValidName(m.b.StackID) || !plugin.ValidName(m.b.Label) {
		return provider.Unknown, nil, fmt.Errorf("example: machine %q of stack %q: not a machine of this provider", m.b.Label, m.b.StackID)
	}
	if _, err := os.Stat(m.dir()); err != nil {
		return provider.Terminated, nil, nil
	}
	if pid := supervisor(m.dir()); pid > 0 {
		return provider.Running, &Metadata{PID: pid, Disk: m.dir()}, nil
	}
	return provider.Stopped, &Metadata{Disk: m.dir()}, nil
}

// Stop powers the machine off: every process of it ends; its disk stays.
func (m *machine) Stop(ctx context.Context) (any, error) {
	defer m.e.lock(m.dir())()
	if err := stopMachine(ctx, m.dir()); err != nil {
		return nil, fmt.Errorf("example: stop %s: %w", m.b.Label, err)
	}
	if err := m.e.setOff(m.b.StackID, m.b.Label, true); err != nil {
		return nil, fmt.Errorf("example: stop %s: %w", m.b.Label, err)
	}
	return &Metadata{Disk: m.dir()}, nil
}

// Start powers the machine on from its disk: the agent's supervisor starts again (what a
// booting VM's init does; provisioning put the starter there). Start and Stop keep whether the
// machine is meant to be on in its record (Off), for Resume after a plugin restart.
func (m *machine) Start(ctx context.Context) (any, error) {
	defer m.e.lock(m.dir())()
	if err := m.e.setOff(m.b.StackID, m.b.Label, false); err != nil {
		return nil, fmt.Errorf("example: start %s: %w", m.b.Label, err)
	}
	os.Remove(filepath.Join(m.dir(), resumeFailedPath)) // started by hand: that is over
	if pid := supervisor(m.dir()); pid > 0 {
		return &Metadata{PID: pid, Disk: m.dir()}, nil // already running
	}
	starter := filepath.Join(m.dir(), userdata.StartKlientPath)
	if _, err := os.Stat(starter); err != nil {
		return nil, fmt.Errorf("example: machine %s has no agent to start (was it ever built?): %w", m.b.Label, err)
	}
	cmd := exec.CommandContext(ctx, "/bin/bash", starter)
	cmd.Dir, cmd.Env = m.dir(), machineEnv(m.dir(), home(m.dir()))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("example: start %s: %w: %s", m.b.Label, err, bytes.TrimSpace(out))
	}
	return &Metadata{PID: supervisor(m.dir()), Disk: m.dir()}, nil
}

var _ provider.Machine = (*machine)(nil)

// Processes. Every process of a machine carries envMachine=<its dir> in its environment: the
// boot and Start give it to the first one and everything it starts inherits it (provisioning,
// klient's supervisor and klient, the user's script, terminal shells). That is how Stop and
// destroy find all of them. (A process that clears its environment escapes: process machines
// are an example, not a container.)
const envMachine = "KLOUD_EXAMPLE_MACHINE"

// machineEnv is the environment a machine's processes start with: nothing of the provider's.
func machineEnv(dir, home string) []string {
	return []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin", "HOME=" + home, "LANG=C.UTF-8", envMachine + "=" + dir}
}

// home is the owner's home directory in the machine (home/<owner>; the one entry of home/).
func home(dir string) string {
	entries, _ := os.ReadDir(filepath.Join(dir, "home"))
	if len(entries) == 1 {
		return filepath.Join(dir, "home", entries[0].Name())
	}
	return dir
}

// procs returns the live processes of the machine at dir.
func procs(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || !alive(pid) {
			continue
		}
		if ofMachine(pid, dir) {
			out = append(out, pid)
		}
	}
	return out
}

// supervisor returns the pid of the machine's running agent supervisor, 0 if none: the pid in
// its pid file, if that process is alive and the machine's (a stale file never names another
// process).
func supervisor(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, userdata.SupervisorPIDPath))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	if !alive(pid) || !ofMachine(pid, dir) {
		return 0
	}
	return pid
}

// ofMachine reports whether process pid carries the marker of the machine at dir.
func ofMachine(pid int, dir string) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		if string(kv) == envMachine+"="+dir {
			return true
		}
	}
	return false
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')') // "pid (comm) S ...": the state follows the last ')'
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// stopMachine ends every process of the machine at dir: SIGTERM, up to 3 s to exit, then
// SIGKILL until none is left (a dying process may start another meanwhile).
func stopMachine(ctx context.Context, dir string) error {
	pids := procs(dir)
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	for deadline := time.Now().Add(3 * time.Second); ; pids = procs(dir) {
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	for range 100 {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
		if pids = procs(dir); len(pids) == 0 {
			return nil
		}
	}
	return fmt.Errorf("processes of the machine at %s keep running: %v", dir, pids)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
