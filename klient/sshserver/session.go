package sshserver

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"

	"github.com/kloud-dev/kloud/klient/webterm"
)

// SafeEnv says whether an "env" request may set name: the locale (LANG, LC_*), TERM,
// COLORTERM, TZ, the git author variables and GIT_PROTOCOL (git over SSH asks for protocol v2
// with it, as sshd's "AcceptEnv GIT_PROTOCOL"). Anything else (LD_PRELOAD, PATH, BASH_ENV, ...)
// is refused.
func SafeEnv(name string) bool {
	switch name {
	case "LANG", "LANGUAGE", "TERM", "COLORTERM", "TZ", "GIT_PROTOCOL",
		"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL":
		return true
	}
	return strings.HasPrefix(name, "LC_") && len(name) > 3 && !strings.ContainsAny(name, "=\x00")
}

// session is one "session" channel.
type session struct {
	s    *Server
	ctx  context.Context
	base context.Context // Serve's: done when klient stops (a restart, an upgrade)
	ch   ssh.Channel
	info ConnInfo
	acct webterm.Account
	log  *slog.Logger

	env     []string
	pty     *ptyReq
	started bool
	resize  chan ptyWindow // window changes of the running program (buffered)
	gone    chan struct{}  // closed when the client closed the channel
}

type ptyWindow struct{ cols, rows uint32 }

// ptyReq is the payload of "pty-req" (RFC 4254 6.2).
type ptyReq struct {
	Term          string
	Cols, Rows    uint32
	Width, Height uint32
	Modes         string
}

// Request payloads (RFC 4254).
type (
	envReq     struct{ Name, Value string }
	execReq    struct{ Command string }
	subsysReq  struct{ Name string }
	windowReq  struct{ Cols, Rows, Width, Height uint32 }
	exitStatus struct{ Status uint32 }
	exitSignal struct {
		Signal     string
		CoreDumped bool
		Msg, Lang  string
	}
)

func (ss *session) run(reqs <-chan *ssh.Request) {
	defer ss.ch.Close()
	ss.resize = make(chan ptyWindow, 8)
	ss.gone = make(chan struct{})
	done := make(chan struct{})
	for {
		select {
		case r, ok := <-reqs:
			if !ok { // the client closed the channel: what runs is hung up
				close(ss.gone)
				if !ss.started {
					return
				}
				<-done
				return
			}
			ok = ss.request(r, done)
			if r.WantReply {
				r.Reply(ok, nil)
			}
		case <-done:
			// The program ended: the channel is closed by the deferred Close; drain requests.
			go ssh.DiscardRequests(reqs)
			return
		}
	}
}

// request handles one channel request and says whether it succeeded.
func (ss *session) request(r *ssh.Request, done chan struct{}) bool {
	switch r.Type {
	case "env":
		var e envReq
		if ssh.Unmarshal(r.Payload, &e) != nil || !SafeEnv(e.Name) || strings.ContainsRune(e.Value, 0) {
			ss.log.Debug("ssh env refused", "name", e.Name)
			return false
		}
		ss.env = append(ss.env, e.Name+"="+e.Value)
		return true
	case "pty-req":
		var p ptyReq
		if ss.started || ssh.Unmarshal(r.Payload, &p) != nil {
			return false
		}
		ss.pty = &p
		return true
	case "window-change":
		var w windowReq
		if ssh.Unmarshal(r.Payload, &w) != nil {
			return false
		}
		select {
		case ss.resize <- ptyWindow{w.Cols, w.Rows}:
		default:
		}
		return true
	case "shell", "exec", "subsystem":
		if ss.started {
			return false
		}
		var run func() (int, string)
		switch r.Type {
		case "shell":
			run = ss.shell
			if ss.pty == nil {
				run = func() (int, string) { return ss.command("") }
			}
		case "exec":
			var e execReq
			if ssh.Unmarshal(r.Payload, &e) != nil {
				return false
			}
			run = func() (int, string) { return ss.command(e.Command) }
		case "subsystem":
			var sr subsysReq
			if ssh.Unmarshal(r.Payload, &sr) != nil || sr.Name != "sftp" || ss.s.o.SFTP == nil {
				return false
			}
			run = ss.sftp
		}
		ss.started = true
		go func() {
			defer close(done)
			status, sig := run()
			ss.ch.CloseWrite()
			if sig != "" {
				ss.ch.SendRequest("exit-signal", false, ssh.Marshal(exitSignal{Signal: sig}))
			} else {
				ss.ch.SendRequest("exit-status", false, ssh.Marshal(exitStatus{Status: uint32(status)}))
			}
		}()
		return true
	}
	// auth-agent-req@openssh.com (agent forwarding), x11-req, signal, keepalive@openssh.com, ...
	return false
}

// shell is a login shell in a web terminal session of the account (listed and viewable like
// the browser's); it ends when the shell exits, and the session is killed when the channel
// closes first, unless klient is stopping: then it stays (in its holder, when sessions have
// them), and `kloud ssh MACHINE --session ID` reattaches to it.
func (ss *session) shell() (int, string) {
	cols, rows := clampSize(ss.pty.Cols, ss.pty.Rows)
	id := "ssh-" + strings.ToLower(rand.Text()[:10])
	v, _, err := ss.s.o.Terminals.Open(webterm.OpenRequest{Session: id, User: ss.info.User, Mode: webterm.ModeCreate,
		RunAs: ss.acct.Name, Cols: cols, Rows: rows})
	if err != nil {
		fmt.Fprintf(ss.ch.Stderr(), "kloud: cannot start a shell: %v\r\n", err)
		return 1, ""
	}
	ss.log.Info("ssh shell started", "session", v.Session())
	ctx, cancel := context.WithCancel(ss.ctx)
	defer cancel()
	go func() { // input (an EOF of it is no hang-up: a terminal has none)
		buf := make([]byte, 32<<10)
		for {
			n, err := ss.ch.Read(buf)
			if n > 0 && v.Input(buf[:n]) != nil {
				return
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-ss.gone: // the client closed the channel: hang the session up
				cancel()
				return
			case w := <-ss.resize:
				c, r := clampSize(w.cols, w.rows)
				v.Resize(c, r)
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := v.Next(ctx, buf)
		if n > 0 {
			if _, werr := ss.ch.Write(buf[:n]); werr != nil {
				ss.hangUp(v)
				return 1, ""
			}
		}
		if err != nil {
			if ctx.Err() != nil { // the channel or the connection ended (revoked, or gone)
				ss.hangUp(v)
				return 1, ""
			}
			return shellStatus(err), ""
		}
	}
}

// hangUp ends the shell's session when its SSH connection is gone, unless klient is stopping (a
// restart, an upgrade): then the shell stays in its session's holder, detached, as a browser
// terminal's does (the SSH connection itself cannot outlive klient).
func (ss *session) hangUp(v *webterm.Viewer) {
	if ss.base.Err() != nil {
		v.Close()
		ss.log.Info("ssh shell left running: klient stops", "session", v.Session())
		return
	}
	ss.s.o.Terminals.Kill(v.Session(), "session ended: the SSH connection closed")
}

// shellStatus is the exit status a web terminal session's end reason gives.
func shellStatus(err error) int {
	var ee *webterm.EndError
	if !errors.As(err, &ee) {
		return 1
	}
	var st int
	if _, serr := fmt.Sscanf(ee.Reason, "session ended: the shell exited with status %d", &st); serr == nil {
		return st
	}
	if strings.HasPrefix(ee.Reason, "session ended: the shell exited") {
		return 0
	}
	return 1
}

func clampSize(cols, rows uint32) (int, int) {
	c, r := int(cols), int(rows)
	if c <= 0 || c > webterm.MaxCols {
		c = 80
	}
	if r <= 0 || r > webterm.MaxRows {
		r = 24
	}
	return c, r
}

// cmdFor is the account's login shell running command (-c), or the login shell itself
// ("" : a shell without a pty), in its home, with its environment and the accepted env.
func (ss *session) cmdFor(command string) *exec.Cmd {
	a := ss.acct
	args := []string{"-" + baseName(a.Shell)}
	if command != "" {
		args = []string{baseName(a.Shell), "-c", command}
	}
	dir := a.Home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/"
	}
	env := append(append([]string{}, a.Env...), ss.env...)
	env = append(env, "SSH_CONNECTION=127.0.0.1 0 127.0.0.1 22", "KLOUD_SSH=1")
	if ss.pty != nil {
		env = append(env, "TERM="+ss.pty.Term)
	}
	cmd := &exec.Cmd{Path: a.Shell, Args: args, Env: env, Dir: dir,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Credential: a.Credential}}
	return cmd
}

func baseName(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

// command runs command (or the login shell) as the account, on a pty if one was asked for.
func (ss *session) command(command string) (int, string) {
	cmd := ss.cmdFor(command)
	if ss.pty != nil {
		return ss.withPTY(cmd)
	}
	return ss.withPipes(cmd)
}

func (ss *session) withPipes(cmd *exec.Cmd) (int, string) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return ss.failed(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return ss.failed(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return ss.failed(err)
	}
	if err := cmd.Start(); err != nil {
		return ss.failed(err)
	}
	stop := ss.killOnEnd(cmd)
	defer stop()
	go func() {
		io.Copy(stdin, ss.ch)
		stdin.Close()
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(ss.ch, stdout) }()
	go func() { defer wg.Done(); io.Copy(ss.ch.Stderr(), stderr) }()
	wg.Wait()
	return waitStatus(cmd.Wait())
}

func (ss *session) withPTY(cmd *exec.Cmd) (int, string) {
	cols, rows := clampSize(ss.pty.Cols, ss.pty.Rows)
	cmd.SysProcAttr.Setctty = true
	master, err := pty.StartWithAttrs(cmd, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}, cmd.SysProcAttr)
	if err != nil {
		return ss.failed(err)
	}
	defer master.Close()
	stop := ss.killOnEnd(cmd)
	defer stop()
	ctx, cancel := context.WithCancel(ss.ctx)
	defer cancel()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case w := <-ss.resize:
				c, r := clampSize(w.cols, w.rows)
				pty.Setsize(master, &pty.Winsize{Cols: uint16(c), Rows: uint16(r)})
			}
		}
	}()
	go io.Copy(master, ss.ch)
	out := make(chan struct{})
	go func() { defer close(out); io.Copy(ss.ch, master) }()
	err = cmd.Wait()
	select {
	case <-out:
	case <-time.After(time.Second): // a background job still holds the terminal
	}
	return waitStatus(err)
}

// killOnEnd hangs up cmd's process group when the connection ends before it exits; stop ends
// the watch.
func (ss *session) killOnEnd(cmd *exec.Cmd) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
			return
		case <-ss.ctx.Done():
		case <-ss.gone:
		}
		pid := cmd.Process.Pid
		syscall.Kill(-pid, syscall.SIGHUP)
		t := time.NewTimer(3 * time.Second)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}()
	return func() { close(done) }
}

// sftp runs the sftp server as the account on the channel.
func (ss *session) sftp() (int, string) {
	cmd := ss.s.o.SFTP()
	a := ss.acct
	cmd.Env = append(append([]string{}, a.Env...), cmd.Env...)
	cmd.Dir = a.Home
	if fi, err := os.Stat(cmd.Dir); err != nil || !fi.IsDir() {
		cmd.Dir = "/"
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: a.Credential}
	ss.log.Info("ssh sftp started")
	return ss.withPipes(cmd)
}

func (ss *session) failed(err error) (int, string) {
	fmt.Fprintf(ss.ch.Stderr(), "kloud: %v\r\n", err)
	ss.log.Warn("ssh command", "err", err)
	return 255, ""
}

// waitStatus is the exit status, or the signal name, of a finished command.
func waitStatus(err error) (int, string) {
	if err == nil {
		return 0, ""
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 0, signalName(ws.Signal())
		}
		return ee.ExitCode(), ""
	}
	return 255, ""
}

// signalName is sig as RFC 4254 names it ("TERM", "KILL", ...).
func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGABRT:
		return "ABRT"
	case syscall.SIGALRM:
		return "ALRM"
	case syscall.SIGFPE:
		return "FPE"
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGILL:
		return "ILL"
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGKILL:
		return "KILL"
	case syscall.SIGPIPE:
		return "PIPE"
	case syscall.SIGQUIT:
		return "QUIT"
	case syscall.SIGSEGV:
		return "SEGV"
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGUSR1:
		return "USR1"
	case syscall.SIGUSR2:
		return "USR2"
	}
	return "KILL"
}
