package webterm

// Session holders: with Options.SessionDir set, a session's PTY and shell do not live in klient
// but in a small process of their own, the holder (klient's binary re-executed as
// `klient session-hold ID`, HolderMain), so that they outlive klient: a restart or an upgrade of
// klient closes the connections to the holders, and the next klient (New) finds them again by
// their unix sockets in SessionDir and restores the sessions, shell pid, scrollback and all.
//
// The holder owns the PTY master and the shell (its child, in a session of its own), keeps a
// scrollback ring of its own, and listens on SessionDir/ID.sock (the directory 0700, the socket
// 0600, and a peer must be root or the holder's own uid: SO_PEERCRED). One klient at a time is
// connected; a new connection replaces the old one. Frames both ways are a type byte, a 4-byte
// big-endian length and the payload:
//
//	holder → klient: 'i' info (JSON holderInfo, first on every connection), 'r' the scrollback
//	                 (second), 'o' output, 'x' the shell ended (the reason, after the last output)
//	klient → holder: 'I' input, 'R' resize (JSON Size), 'N' rename, 'K' kill (JSON {graceMs}),
//	                 'B' bye (klient collected the end: the holder exits)
//
// Flow control is a blocking socket: while klient does not read (its viewers are full), the
// holder's write blocks and it stops reading the PTY. While no klient is connected the holder
// reads the PTY into its ring only, as a session with no viewer does. After the shell ended,
// the holder waits for a klient to collect the reason (bye) at most holderExitLinger (or the
// orphan timeout, if shorter), then exits and removes its socket. A holder no klient has been
// connected to for the orphan timeout (klient's IdleTimeout) hangs up its shell.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// HolderArg is the first argument that makes klient's binary a session holder (HolderMain).
const HolderArg = "session-hold"

// holderExitLinger bounds how long a holder whose shell ended waits for klient to collect it.
const holderExitLinger = time.Minute

// maxHolderFrame bounds one frame (a replay is at most the scrollback).
const maxHolderFrame = 64 << 20

const (
	frameInfo   = 'i'
	frameReplay = 'r'
	frameOutput = 'o'
	frameExit   = 'x'
	frameInput  = 'I'
	frameResize = 'R'
	frameRename = 'N'
	frameKill   = 'K'
	frameBye    = 'B'
)

// holderSpec is what klient tells a new holder on its stdin: the session and the shell to run.
type holderSpec struct {
	Session    string    `json:"session"`
	CreatedBy  string    `json:"createdBy"`
	RunAs      string    `json:"runAs"`
	CreatedAt  time.Time `json:"createdAt"`
	Socket     string    `json:"socket"`
	Scrollback int       `json:"scrollback"`
	Cols       int       `json:"cols"`
	Rows       int       `json:"rows"`
	Shell      string    `json:"shell"`
	Args       []string  `json:"args"`
	Env        []string  `json:"env"`
	Dir        string    `json:"dir"`
	// OrphanTimeout ends the shell (SIGHUP, SIGKILL after KillGrace) when no klient has been
	// connected for this long: klient's IdleTimeout, which klient cannot enforce while it is gone.
	OrphanTimeout time.Duration `json:"orphanTimeout"`
	KillGrace     time.Duration `json:"killGrace"`
	Cred          bool          `json:"cred"` // run the shell as UID/GID/Groups (klient is root)
	UID           uint32        `json:"uid"`
	GID           uint32        `json:"gid"`
	Groups        []uint32      `json:"groups"`
}

// holderInfo is what a holder says first on every connection.
type holderInfo struct {
	Session      string    `json:"session"`
	Name         string    `json:"name"`
	CreatedBy    string    `json:"createdBy"`
	RunAs        string    `json:"runAs"`
	CreatedAt    time.Time `json:"createdAt"`
	Cols         int       `json:"cols"`
	Rows         int       `json:"rows"`
	PID          int       `json:"pid"`       // the shell's
	HolderPID    int       `json:"holderPid"` // the holder's
	LastOutputAt time.Time `json:"lastOutputAt"`
}

type killFrame struct {
	GraceMs int64 `json:"graceMs"`
}

func writeFrame(w io.Writer, typ byte, p []byte) error {
	hdr := make([]byte, 5, 5+len(p))
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	_, err := w.Write(append(hdr, p...))
	return err
}

func readFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxHolderFrame {
		return 0, nil, fmt.Errorf("holder frame of %d bytes: too large", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return hdr[0], p, nil
}

// HolderMain runs a session holder: it reads a holderSpec on stdin, starts the shell, answers
// "ok PID" (or "error ...") on stdout, and serves the session until it ends. cmd/klient calls it
// when its first argument is HolderArg; it returns the exit code.
func HolderMain() int {
	var spec holderSpec
	if err := json.NewDecoder(os.Stdin).Decode(&spec); err != nil {
		fmt.Printf("error read spec: %s\n", err)
		return 2
	}
	h, err := startHolder(spec)
	if err != nil {
		fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return 1
	}
	fmt.Printf("ok %d\n", h.cmd.Process.Pid)
	// klient stops listening to us: nothing may write to its pipes any more.
	if null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0); err == nil {
		for fd := 0; fd <= 2; fd++ {
			unix.Dup2(int(null.Fd()), fd)
		}
		null.Close()
	}
	h.run()
	return 0
}

// holder is the holder process's state.
type holder struct {
	spec     holderSpec
	cmd      *exec.Cmd
	pty      *os.File
	ln       *net.UnixListener
	closePTY sync.Once
	inputMu  sync.Mutex

	mu         sync.Mutex
	conn       *holderConn // the klient connected now, or nil
	name       string
	cols, rows int
	ring       *ring
	lastOutput time.Time
	exit       *string // the reason, once the shell ended and its output was read
	bye        chan struct{}
	byeOnce    sync.Once
	readerDone chan struct{}
	orphan     *time.Timer // runs while no klient is connected
}

// holderConn is one klient connection; writes are whole frames, one at a time.
type holderConn struct {
	c   *net.UnixConn
	wmu sync.Mutex
}

func (c *holderConn) write(typ byte, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return writeFrame(c.c, typ, p)
}

func startHolder(spec holderSpec) (*holder, error) {
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	p, tty, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("open pty: %w", err)
	}
	defer tty.Close()
	if err := pty.Setsize(tty, &pty.Winsize{Cols: uint16(spec.Cols), Rows: uint16(spec.Rows)}); err != nil {
		p.Close()
		return nil, fmt.Errorf("set pty size: %w", err)
	}
	// Non-blocking (pty.Open leaves it blocking): closing it must interrupt the reader, which a
	// background job holding the terminal would otherwise keep waiting for ever (ci54: a killed
	// session's holder outlived its shell, read blocked, its exit never sent).
	if p, err = nonblocking(p); err != nil {
		return nil, err
	}
	attr := &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if spec.Cred {
		attr.Credential = &syscall.Credential{Uid: spec.UID, Gid: spec.GID, Groups: spec.Groups}
	}
	// Listen before the shell starts: a holder that cannot be reached must not leave one.
	os.Remove(spec.Socket)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: spec.Socket, Net: "unix"})
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(spec.Socket, 0o600); err != nil {
		ln.Close()
		p.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	cmd := &exec.Cmd{Path: spec.Shell, Args: spec.Args, Env: spec.Env, Dir: spec.Dir, Stdin: tty, Stdout: tty, Stderr: tty, SysProcAttr: attr}
	if err := cmd.Start(); err != nil {
		ln.Close()
		p.Close()
		return nil, fmt.Errorf("start %s as %s: %w", spec.Shell, spec.RunAs, err)
	}
	if spec.Scrollback <= 0 {
		spec.Scrollback = DefaultScrollback
	}
	return &holder{spec: spec, cmd: cmd, pty: p, ln: ln, name: spec.Session, cols: spec.Cols, rows: spec.Rows,
		ring: newRing(spec.Scrollback), bye: make(chan struct{}), readerDone: make(chan struct{})}, nil
}

func (h *holder) run() {
	h.mu.Lock()
	h.orphaned()
	h.mu.Unlock()
	go h.accept()
	go h.read()
	err := h.cmd.Wait()
	select {
	case <-h.readerDone:
	case <-time.After(2 * time.Second): // a background job still holds the terminal
	}
	h.closeMaster()
	<-h.readerDone
	reason := exitReason(err)
	h.mu.Lock()
	h.exit = &reason
	c := h.conn
	h.mu.Unlock()
	if c != nil {
		c.write(frameExit, []byte(reason))
	}
	linger := holderExitLinger
	if t := h.spec.OrphanTimeout; t > 0 && t < linger {
		linger = t
	}
	select {
	case <-h.bye:
	case <-time.After(linger):
	}
	h.ln.Close() // removes the socket
	h.mu.Lock()
	if h.conn != nil {
		h.conn.c.Close()
	}
	h.mu.Unlock()
}

// exitReason says how a shell ended, for its viewers.
func exitReason(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("session ended: the shell was killed by %s", ws.Signal())
		}
		return fmt.Sprintf("session ended: the shell exited with status %d", ee.ExitCode())
	}
	return "session ended: the shell exited"
}

func (h *holder) closeMaster() { h.closePTY.Do(func() { h.pty.Close() }) }

// read copies the PTY's output into the ring and to the connected klient (blocking while it
// does not read).
func (h *holder) read() {
	defer close(h.readerDone)
	buf := make([]byte, 32<<10)
	for {
		n, err := h.pty.Read(buf)
		if n > 0 {
			h.mu.Lock()
			h.ring.Write(buf[:n])
			h.lastOutput = time.Now()
			c := h.conn
			h.mu.Unlock()
			if c != nil && c.write(frameOutput, buf[:n]) != nil {
				h.drop(c)
			}
		}
		if err != nil {
			return
		}
	}
}

func (h *holder) drop(c *holderConn) {
	h.mu.Lock()
	if h.conn == c {
		h.conn = nil
		h.orphaned()
	}
	h.mu.Unlock()
	c.c.Close()
}

// orphaned starts the orphan timer (h.mu held): a shell no klient looks after for
// OrphanTimeout is hung up, as klient would end a session without viewers.
func (h *holder) orphaned() {
	if h.spec.OrphanTimeout <= 0 || h.orphan != nil {
		return
	}
	h.orphan = time.AfterFunc(h.spec.OrphanTimeout, func() {
		h.mu.Lock()
		gone := h.conn == nil
		h.mu.Unlock()
		if gone {
			h.hangup(h.spec.KillGrace)
		}
	})
}

// hangup ends the shell: SIGHUP to its group and the PTY closed now, SIGKILL after grace.
func (h *holder) hangup(grace time.Duration) {
	pid := h.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGHUP)
	h.closeMaster()
	go func() {
		time.Sleep(grace)
		syscall.Kill(-pid, syscall.SIGKILL) // the group is gone by then, or must go
	}()
}

func (h *holder) accept() {
	for {
		uc, err := h.ln.AcceptUnix()
		if err != nil {
			return
		}
		if !peerAllowed(uc) {
			uc.Close()
			continue
		}
		h.attach(&holderConn{c: uc})
	}
}

// peerAllowed admits root and the holder's own uid (klient).
func peerAllowed(uc *net.UnixConn) bool {
	sc, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := sc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return false
	}
	return cred.Uid == 0 || int(cred.Uid) == os.Geteuid()
}

// attach makes c the connected klient: it gets the info, the scrollback, then the output (and
// the end, if the shell already ended).
func (h *holder) attach(c *holderConn) {
	h.mu.Lock()
	old := h.conn
	h.conn = nil
	h.mu.Unlock()
	if old != nil {
		old.c.Close()
	}
	h.mu.Lock()
	info, _ := json.Marshal(holderInfo{Session: h.spec.Session, Name: h.name, CreatedBy: h.spec.CreatedBy, RunAs: h.spec.RunAs,
		CreatedAt: h.spec.CreatedAt, Cols: h.cols, Rows: h.rows, PID: h.cmd.Process.Pid, HolderPID: os.Getpid(), LastOutputAt: h.lastOutput})
	err := c.write(frameInfo, info)
	if err == nil {
		err = c.write(frameReplay, h.ring.Bytes())
	}
	if err == nil && h.exit != nil {
		err = c.write(frameExit, []byte(*h.exit))
	}
	if err == nil {
		h.conn = c
		if h.orphan != nil {
			h.orphan.Stop()
			h.orphan = nil
		}
	}
	h.mu.Unlock()
	if err != nil {
		c.c.Close()
		return
	}
	go h.control(c)
}

// control serves what klient sends on c.
func (h *holder) control(c *holderConn) {
	defer h.drop(c)
	for {
		typ, p, err := readFrame(c.c)
		if err != nil {
			return
		}
		switch typ {
		case frameInput:
			h.inputMu.Lock()
			for len(p) > 0 {
				n, err := h.pty.Write(p)
				if err != nil {
					break
				}
				p = p[n:]
			}
			h.inputMu.Unlock()
		case frameResize:
			var sz Size
			if json.Unmarshal(p, &sz) == nil && checkSize(sz.Cols, sz.Rows) == nil {
				if setSize(h.pty, sz.Cols, sz.Rows) == nil { // not pty.Setsize: its Fd() makes the master blocking again
					h.mu.Lock()
					h.cols, h.rows = sz.Cols, sz.Rows
					h.mu.Unlock()
				}
			}
		case frameRename:
			h.mu.Lock()
			h.name = string(p)
			h.mu.Unlock()
		case frameKill:
			var k killFrame
			json.Unmarshal(p, &k)
			h.hangup(time.Duration(k.GraceMs) * time.Millisecond)
		case frameBye:
			h.byeOnce.Do(func() { close(h.bye) })
			return
		}
	}
}
