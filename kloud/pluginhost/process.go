package pluginhost

// One run of a plugin process: its environment and key, the sandbox, its output in kloud's
// log, its stop (SIGTERM, then SIGKILL) and how it ended (launcher.go supervises the runs).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/internal/sandbox"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// pluginEnvPath is the PATH a plugin gets (nothing else of kloud's environment reaches it).
const pluginEnvPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// runOnce starts the plugin, waits until it exits (the error says how, with its last lines) or
// is stopped (SIGTERM, SIGKILL after StopGrace). err is for a plugin that could not be started.
func (l *launcher) runOnce(p *launched) (exit, err error) {
	unsandboxed := l.unsandboxed(p.name)
	state := filepath.Join(l.stateDir, p.name)
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("plugin state directory: %w", err)
	}
	if !unsandboxed {
		if err := os.Chown(state, l.o.UID, l.o.GID); err != nil {
			return nil, fmt.Errorf("plugin state directory: %w", err)
		}
	}
	key, _, err := l.h.o.Keys.CreatePluginKey(kitekey.PluginKeySpec{Provider: p.name, TTL: l.o.KeyTTL})
	if err != nil {
		return nil, fmt.Errorf("mint the plugin's key: %w", err)
	}
	run := "plugin-" + p.name + "-" + randomHex(8)
	// PTY: a provider's machines may be processes of the plugin whose agents serve terminals
	// (the example provider's); the sandbox's own devpts, none of the host's terminals.
	cfg := sandbox.Config{Program: p.bin, WorkDir: state, ReadOnly: []string{filepath.Dir(p.bin)},
		UID: l.o.UID, GID: l.o.GID, Insecure: unsandboxed, PTY: true, CgroupPrefix: sandbox.CgroupPrefixPlugin}
	if !unsandboxed {
		cfg.Limits = l.o.Limits
	}
	senv, err := cfg.Env(run)
	if err != nil {
		return nil, err
	}
	env := []string{pluginEnvPath, plugin.EnvURL + "=" + l.url, plugin.EnvKey + "=" + key, plugin.EnvStateDir + "=" + state}
	if l.h.o.TLS { // l.url is wss on loopback; the certificate names the public host
		env = append(env, plugin.EnvCA+"="+l.h.o.CACert, plugin.EnvServerName+"="+publicHost(l.h.o.PublicURL))
	}
	for k, v := range senv {
		env = append(env, k+"="+v)
	}
	tail := &lineTail{max: 5}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	started := make(chan error, 1)
	sig := make(chan syscall.Signal)
	exited := make(chan struct{})
	var waitErr error
	var pid int
	go func() {
		// Pdeathsig follows the thread that started the child: keep this goroutine on its
		// thread until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command("/proc/self/exe")
		cmd.Args[0] = Prefix + p.name + " (launcher)"
		cmd.Env, cmd.Dir = env, state
		cmd.Stdout, cmd.Stderr = outW, outW
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		err := cmd.Start()
		outW.Close()
		if err != nil {
			started <- err
			return
		}
		pid = cmd.Process.Pid
		started <- nil
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		for {
			select {
			case s := <-sig:
				if s == syscall.SIGKILL {
					syscall.Kill(-pid, syscall.SIGKILL) // the group: an unsandboxed plugin's children too
				}
				cmd.Process.Signal(s)
			case err := <-waited:
				waitErr = err
				close(exited)
				return
			}
		}
	}()
	if err := <-started; err != nil {
		outR.Close()
		return nil, fmt.Errorf("start %s: %w", p.bin, err)
	}
	p.setPID(pid)
	defer p.setPID(0)
	where := fmt.Sprintf("launched (pid %d, sandboxed as uid %d)", pid, l.o.UID)
	if unsandboxed {
		where = fmt.Sprintf("launched (pid %d, unsandboxed)", pid)
		if !l.o.Insecure {
			l.log.Warn("provider plugin runs WITHOUT its sandbox, with kloud's privileges, as an administrator allowed (--plugin-unsandboxed)", "provider", p.name, "pid", pid)
		}
	}
	l.plugins.Expect(p.name, where)
	l.log.Info("provider plugin started", "provider", p.name, "pid", pid, "bin", p.bin, "sandboxed", !unsandboxed)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		l.copyOutput(p.name, outR, tail)
	}()
	send := func(s syscall.Signal) {
		select {
		case sig <- s:
		case <-exited:
		}
	}
	stopped := false
	select {
	case <-exited:
	case <-p.stop:
		stopped = true
		send(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(l.o.StopGrace):
			l.log.Warn("provider plugin did not stop in time; killing it", "provider", p.name, "pid", pid, "grace", l.o.StopGrace)
			send(syscall.SIGKILL)
			<-exited
		}
	}
	sandbox.Kill(run) // whatever an unsandboxed plugin left carrying its run token
	if err := sandbox.RemoveCgroup(cfg, run); err != nil {
		l.log.Warn("provider plugin's cgroup", "provider", p.name, "err", err)
	}
	// A descendant holding the pipe would keep the copy going: do not wait for it long.
	select {
	case <-copied:
	case <-time.After(time.Second):
		outR.Close()
	}
	cause := describeExit(waitErr, !unsandboxed)
	if stopped {
		l.log.Info("provider plugin stopped", "provider", p.name, "pid", pid, "exit", cause)
	}
	msg := fmt.Sprintf("%s%s (pid %d) exited (%s)", Prefix, p.name, pid, cause)
	if last := tail.String(); last != "" {
		msg += "; its last output: " + last
	}
	return errors.New(msg), nil
}

// copyOutput logs the plugin's output lines with provider=name and keeps the last few.
func (l *launcher) copyOutput(name string, r io.ReadCloser, tail *lineTail) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		tail.add(line)
		l.log.Info("plugin: "+line, "provider", name)
	}
	if err := sc.Err(); err != nil {
		l.log.Warn("plugin output: the rest is not logged", "provider", name, "err", err)
		io.Copy(io.Discard, r) // keep draining: a full pipe would block the plugin
	}
}

// describeExit says how a plugin process ended. Sandboxed, the launcher exits with 128+n when
// the plugin was killed by signal n.
func describeExit(err error, sandboxed bool) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			if ws.Signaled() {
				return "killed by " + unix.SignalName(ws.Signal())
			}
			if c := ws.ExitStatus(); sandboxed && c > 128 && c < 128+65 {
				return "killed by " + unix.SignalName(syscall.Signal(c-128))
			}
		}
		return ee.ProcessState.String()
	}
	return err.Error()
}

// lineTail keeps the last max lines written to it.
type lineTail struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (t *lineTail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(line) > 500 {
		line = line[:500] + "…"
	}
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *lineTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, " | ")
}
