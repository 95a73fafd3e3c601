package webterm

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// Session is a login shell in a PTY that outlives its viewers.
type Session struct {
	m         *Manager
	id        string
	createdBy string
	runAs     string // the account the shell runs as
	createdAt time.Time
	sh        shell // the PTY and shell: in klient (procShell) or in a holder (holderShell)
	pid       int   // the shell's
	closeOnce sync.Once
	closing   chan struct{} // closed when the session stops reading: pushes stop waiting for viewers
	inputMu   sync.Mutex    // one writer at a time, so inputs of two viewers do not interleave

	mu         sync.Mutex
	name       string
	cols, rows int
	ring       *ring
	viewers    []*Viewer // copy-on-write: the reader uses a snapshot without copying
	idle       *time.Timer
	lastOutput time.Time
	killReason string
	detached   bool // klient is going away and left the shell to its holder
	ended      bool

	readerDone chan struct{}
	done       chan struct{}
}

// shell is where a session's PTY and shell live: Read is the output (an error at the end),
// Write the input.
type shell interface {
	io.ReadWriter
	resize(cols, rows int) error
	rename(name string)
	// hangup ends the shell: SIGHUP to its group now, SIGKILL after grace (unless done closes).
	hangup(grace time.Duration, done <-chan struct{})
	// stop makes Read return: the PTY is closed (procShell) or left to its holder (holderShell).
	stop()
	// wait returns, after the reader has stopped, why the shell ended ("": klient detached).
	wait(readerDone <-chan struct{}) string
	pid() int
}

func newSession(m *Manager, id, createdBy, runAs string, createdAt time.Time, sh shell, pid, cols, rows int) *Session {
	return &Session{
		m: m, id: id, name: id, createdBy: createdBy, runAs: runAs, createdAt: createdAt, sh: sh, pid: pid,
		cols: cols, rows: rows, ring: newRing(m.opts.Scrollback), readerDone: make(chan struct{}), done: make(chan struct{}), closing: make(chan struct{}),
	}
}

// startSession runs a's login shell in a new PTY of cols×rows: in a holder process when the
// Manager has a SessionDir, else in klient.
func startSession(m *Manager, id, createdBy string, a *account, cols, rows int) (*Session, error) {
	if m.opts.SessionDir != "" {
		hs, replay, err := m.startHolder(id, createdBy, a, cols, rows)
		if err != nil {
			return nil, err
		}
		s := newSession(m, id, createdBy, a.Name, hs.info.CreatedAt, hs, hs.info.PID, cols, rows)
		s.ring.Write(replay)
		go s.read()
		go s.wait()
		return s, nil
	}
	ps, err := startProcShell(a, id, cols, rows)
	if err != nil {
		return nil, err
	}
	s := newSession(m, id, createdBy, a.Name, time.Now().UTC(), ps, ps.cmd.Process.Pid, cols, rows)
	go s.read()
	go s.wait()
	return s, nil
}

// procShell is a shell in a PTY of klient's own.
type procShell struct {
	cmd      *exec.Cmd
	pty      *os.File // the master, non-blocking (in Go's poller)
	closePTY sync.Once
}

func startProcShell(a *account, id string, cols, rows int) (*procShell, error) {
	p, tty, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("open pty: %w", err)
	}
	defer tty.Close()
	master, err := nonblocking(p)
	if err != nil {
		return nil, err
	}
	if err := pty.Setsize(tty, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		master.Close()
		return nil, fmt.Errorf("set pty size: %w", err)
	}
	dir := a.Home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/"
	}
	cmd := &exec.Cmd{
		Path:   a.Shell,
		Args:   []string{"-" + filepath.Base(a.Shell)}, // a login shell, as login(1) starts it
		Env:    a.env(id),
		Dir:    dir,
		Stdin:  tty,
		Stdout: tty,
		Stderr: tty,
		SysProcAttr: &syscall.SysProcAttr{
			Setsid: true, Setctty: true, Ctty: 0, Credential: a.Credential,
		},
	}
	if err := cmd.Start(); err != nil {
		master.Close()
		return nil, fmt.Errorf("start %s as %s: %w", a.Shell, a.Name, err)
	}
	return &procShell{cmd: cmd, pty: master}, nil
}

func (p *procShell) Read(b []byte) (int, error)  { return p.pty.Read(b) }
func (p *procShell) Write(b []byte) (int, error) { return p.pty.Write(b) }
func (p *procShell) rename(string)               {}
func (p *procShell) pid() int                    { return p.cmd.Process.Pid }
func (p *procShell) stop()                       { p.closePTY.Do(func() { p.pty.Close() }) }

func (p *procShell) resize(cols, rows int) error { return setSize(p.pty, cols, rows) }

// setSize sets the window size of the PTY master f without f.Fd() (which pty.Setsize calls,
// and which would make the non-blocking master blocking again).
func setSize(f *os.File, cols, rows int) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	err = sc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)})
	})
	if err == nil {
		err = ierr
	}
	return err
}

// hangup: SIGHUP to the shell's process group and closing the PTY (which hangs up its
// foreground job too); SIGKILL to the group if the shell is still there after grace.
func (p *procShell) hangup(grace time.Duration, done <-chan struct{}) {
	pid := p.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGHUP)
	p.stop()
	go func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}()
}

// wait reaps the shell and lets the reader drain what it wrote last.
func (p *procShell) wait(readerDone <-chan struct{}) string {
	err := p.cmd.Wait()
	select {
	case <-readerDone: // every holder of the terminal is gone
	case <-time.After(2 * time.Second): // a background job still holds it: stop reading anyway
	}
	p.stop()
	<-readerDone
	return exitReason(err)
}

// nonblocking returns a non-blocking copy of the PTY master (pty.Open leaves it blocking), so
// reads park in Go's poller instead of holding a thread, and Close interrupts them.
func nonblocking(p *os.File) (*os.File, error) {
	defer p.Close()
	fd, err := unix.Dup(int(p.Fd()))
	if err != nil {
		return nil, fmt.Errorf("dup pty: %w", err)
	}
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pty: %w", err)
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), nil
}

// read copies the shell's output into the scrollback and to every viewer. While a viewer's queue
// is full it waits (so a fast producer is slowed to what its viewers take), at most
// SlowViewerTimeout per read, then drops the viewers still full.
func (s *Session) read() {
	defer close(s.readerDone)
	buf := make([]byte, 32<<10)
	for {
		n, err := s.sh.Read(buf)
		if n > 0 {
			chunk := make([]byte, n)
			copy(chunk, buf[:n])
			s.mu.Lock()
			s.ring.Write(chunk)
			s.lastOutput = time.Now()
			vs := s.viewers
			s.mu.Unlock()
			if len(vs) > 0 {
				deadline := time.Now().Add(s.m.opts.SlowViewerTimeout)
				for _, v := range vs {
					v.push(chunk, deadline)
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// wait waits for the shell's end (or klient's detaching from it) and ends the session.
func (s *Session) wait() {
	reason := s.sh.wait(s.readerDone)
	s.markClosing()
	code := CloseEnded
	s.mu.Lock()
	if s.killReason != "" {
		reason = s.killReason
	}
	if s.detached {
		// Not the end: the shell lives on in its holder, and a client that reconnects (the UI
		// does on 1001) finds it again once klient is back.
		code, reason = CloseGoingAway, "klient is restarting: the session lives on, reattach"
	}
	s.mu.Unlock()
	s.end(code, reason)
}

func (s *Session) markClosing() { s.closeOnce.Do(func() { close(s.closing) }) }

// end closes every viewer with code and reason (after their queued output) and forgets the
// session.
func (s *Session) end(code int, reason string) {
	s.mu.Lock()
	s.ended = true
	vs := s.viewers
	s.viewers = nil
	if s.idle != nil {
		s.idle.Stop()
	}
	s.mu.Unlock()
	for _, v := range vs {
		v.close(code, reason, false)
	}
	s.m.forget(s)
	s.m.log.Info("webterm session ended", "session", s.id, "reason", reason)
	close(s.done)
}

// kill hangs the session up (the shell gets SIGHUP, and SIGKILL after KillGrace).
func (s *Session) kill(reason string) {
	s.mu.Lock()
	if s.ended || s.killReason != "" || s.detached {
		s.mu.Unlock()
		return
	}
	s.killReason = reason
	s.mu.Unlock()
	s.sh.hangup(s.m.opts.KillGrace, s.done)
	s.markClosing()
}

// letGo leaves the shell to its holder: the session ends in klient only.
func (s *Session) letGo() {
	s.mu.Lock()
	if s.ended || s.killReason != "" || s.detached {
		s.mu.Unlock()
		return
	}
	s.detached = true
	s.mu.Unlock()
	s.markClosing()
	s.sh.stop()
}

func (s *Session) input(p []byte) error {
	s.inputMu.Lock()
	defer s.inputMu.Unlock()
	for len(p) > 0 {
		n, err := s.sh.Write(p)
		if err != nil {
			return fmt.Errorf("session %s: write: %w", s.id, err)
		}
		p = p[n:]
	}
	return nil
}

// Resize sets the terminal size.
func (s *Session) Resize(cols, rows int) error {
	if err := checkSize(cols, rows); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cols == cols && s.rows == rows {
		return nil
	}
	if err := s.sh.resize(cols, rows); err != nil {
		return fmt.Errorf("session %s: resize: %w", s.id, err)
	}
	s.cols, s.rows = cols, rows
	return nil
}

// attach adds a viewer that first gets the scrollback, then everything after it.
func (s *Session) attach(user, mode string) (*Viewer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || s.killReason != "" {
		return nil, fmt.Errorf("session %q is ending: %w", s.id, errNotFound)
	}
	v := newViewer(s, user, mode, s.ring.Bytes())
	s.viewers = append(s.viewers[:len(s.viewers):len(s.viewers)], v)
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
	}
	return v, nil
}

// detach removes v; the last one out starts the idle timer.
func (s *Session) detach(v *Viewer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vs := make([]*Viewer, 0, len(s.viewers))
	for _, o := range s.viewers {
		if o != v {
			vs = append(vs, o)
		}
	}
	s.viewers = vs
	if len(vs) == 0 {
		s.startIdleLocked()
	}
}

// startIdle starts the idle timer of a session without viewers (restored ones).
func (s *Session) startIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startIdleLocked()
}

func (s *Session) startIdleLocked() {
	if !s.ended && s.idle == nil {
		d := s.m.opts.IdleTimeout
		s.idle = time.AfterFunc(d, func() {
			s.mu.Lock()
			orphan := len(s.viewers) == 0
			s.mu.Unlock()
			if orphan {
				s.kill(fmt.Sprintf("session ended: no viewer for %s", d))
			}
		})
	}
}

func (s *Session) info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := Info{Session: s.id, Name: s.name, CreatedBy: s.createdBy, RunAs: s.runAs, CreatedAt: s.createdAt, Cols: s.cols, Rows: s.rows,
		PID: s.pid, Viewers: []ViewerInfo{}}
	if !s.lastOutput.IsZero() {
		in.LastOutputAt = s.lastOutput.UTC()
	}
	for _, v := range s.viewers {
		in.Viewers = append(in.Viewers, ViewerInfo{User: v.user, Mode: v.mode, Since: v.since.UTC()})
	}
	return in
}
