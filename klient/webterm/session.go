package webterm

import (
	"errors"
	"fmt"
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
	cmd       *exec.Cmd
	pty       *os.File // the master, non-blocking (in Go's poller)
	closePTY  sync.Once
	closing   chan struct{} // closed with the master: readers stop waiting for viewers
	inputMu   sync.Mutex    // one writer at a time, so inputs of two viewers do not interleave

	mu         sync.Mutex
	name       string
	cols, rows int
	ring       *ring
	viewers    []*Viewer // copy-on-write: the reader uses a snapshot without copying
	idle       *time.Timer
	lastOutput time.Time
	killReason string
	ended      bool

	readerDone chan struct{}
	done       chan struct{}
}

// start runs a's login shell in a new PTY of cols×rows.
func startSession(m *Manager, id, createdBy string, a *account, cols, rows int) (*Session, error) {
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
	s := &Session{
		m: m, id: id, name: id, createdBy: createdBy, runAs: a.Name, createdAt: time.Now().UTC(), cmd: cmd, pty: master,
		cols: cols, rows: rows, ring: newRing(m.opts.Scrollback), readerDone: make(chan struct{}), done: make(chan struct{}), closing: make(chan struct{}),
	}
	go s.read()
	go s.wait()
	return s, nil
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

// read copies the PTY's output into the scrollback and to every viewer. While a viewer's queue
// is full it waits (so a fast producer is slowed to what its viewers take), at most
// SlowViewerTimeout per read, then drops the viewers still full.
func (s *Session) read() {
	defer close(s.readerDone)
	buf := make([]byte, 32<<10)
	for {
		n, err := s.pty.Read(buf)
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

// wait reaps the shell, lets the reader drain what it wrote last, and ends the session.
func (s *Session) wait() {
	err := s.cmd.Wait()
	select {
	case <-s.readerDone: // every holder of the terminal is gone
	case <-time.After(2 * time.Second): // a background job still holds it: stop reading anyway
	}
	s.closeMaster()
	<-s.readerDone
	s.mu.Lock()
	reason := s.killReason
	s.mu.Unlock()
	if reason == "" {
		reason = "session ended: the shell exited"
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				reason = fmt.Sprintf("session ended: the shell was killed by %s", ws.Signal())
			} else {
				reason = fmt.Sprintf("session ended: the shell exited with status %d", ee.ExitCode())
			}
		}
	}
	s.end(reason)
}

func (s *Session) closeMaster() {
	s.closePTY.Do(func() {
		close(s.closing)
		s.pty.Close()
	})
}

// end closes every viewer (after their queued output) and forgets the session.
func (s *Session) end(reason string) {
	s.mu.Lock()
	s.ended = true
	vs := s.viewers
	s.viewers = nil
	if s.idle != nil {
		s.idle.Stop()
	}
	s.mu.Unlock()
	for _, v := range vs {
		v.close(CloseEnded, reason, false)
	}
	s.m.forget(s)
	s.m.log.Info("webterm session ended", "session", s.id, "reason", reason)
	close(s.done)
}

// kill hangs the session up: SIGHUP to the shell's process group and closing the PTY (which
// hangs up its foreground job too); SIGKILL to the group if the shell is still there after
// KillGrace.
func (s *Session) kill(reason string) {
	s.mu.Lock()
	if s.ended || s.killReason != "" {
		s.mu.Unlock()
		return
	}
	s.killReason = reason
	s.mu.Unlock()
	pid := s.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGHUP)
	s.closeMaster()
	go func() {
		t := time.NewTimer(s.m.opts.KillGrace)
		defer t.Stop()
		select {
		case <-s.done:
		case <-t.C:
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}()
}

func (s *Session) input(p []byte) error {
	s.inputMu.Lock()
	defer s.inputMu.Unlock()
	for len(p) > 0 {
		n, err := s.pty.Write(p)
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
	sc, err := s.pty.SyscallConn()
	if err != nil {
		return fmt.Errorf("session %s: resize: %w", s.id, err)
	}
	var ierr error
	err = sc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(cols), Row: uint16(rows)})
	})
	if err == nil {
		err = ierr
	}
	if err != nil {
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
	if len(vs) == 0 && !s.ended && s.idle == nil {
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
		PID: s.cmd.Process.Pid, Viewers: []ViewerInfo{}}
	if !s.lastOutput.IsZero() {
		in.LastOutputAt = s.lastOutput.UTC()
	}
	for _, v := range s.viewers {
		in.Viewers = append(in.Viewers, ViewerInfo{User: v.user, Mode: v.mode, Since: v.since.UTC()})
	}
	return in
}
