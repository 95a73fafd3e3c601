package webterm

// klient's side of session holders (holder.go): starting one for a new session, talking to it
// as a Session's shell, and finding the holders of an earlier klient again (Manager.restore).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// holderShell is klient's side of a holder: the shell interface of a Session.
type holderShell struct {
	m         *Manager
	sock      string
	conn      *net.UnixConn
	wmu       sync.Mutex
	info      holderInfo
	pending   []byte // output read from a frame and not yet returned
	exit      *string
	detaching bool
	adopted   bool // restored from a holder another klient started (not this process's child)
	mu        sync.Mutex
}

// startHolder starts a holder for a new session and connects to it.
func (m *Manager) startHolder(id, createdBy string, a *account, cols, rows int) (*holderShell, []byte, error) {
	dir := a.Home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/"
	}
	spec := holderSpec{Session: id, CreatedBy: createdBy, RunAs: a.Name, CreatedAt: time.Now().UTC(), Socket: m.socketPath(id),
		Scrollback: m.opts.Scrollback, Cols: cols, Rows: rows, Shell: a.Shell, Args: []string{"-" + filepath.Base(a.Shell)},
		Env: a.env(id), Dir: dir, OrphanTimeout: m.opts.IdleTimeout, KillGrace: m.opts.KillGrace}
	if a.Credential != nil {
		spec.Cred, spec.UID, spec.GID, spec.Groups = true, a.Credential.Uid, a.Credential.Gid, a.Credential.Groups
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, nil, err
	}
	hc := m.opts.HolderCommand
	cmd := exec.Command(hc[0], append(append([]string{}, hc[1:]...), HolderArg, id)...)
	cmd.Args[0] = "klient"
	cmd.Env = append(os.Environ(), m.opts.HolderEnv...)
	cmd.Stdin = strings.NewReader(string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // not in klient's process group: it outlives klient
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start session holder: %w", err)
	}
	line := make(chan string, 1)
	go func() {
		var sb strings.Builder
		one := make([]byte, 1)
		for {
			n, err := out.Read(one)
			if n == 1 && one[0] != '\n' {
				sb.WriteByte(one[0])
				continue
			}
			if err != nil || n == 1 {
				break
			}
		}
		line <- sb.String()
		io.Copy(io.Discard, out)
	}()
	var l string
	select {
	case l = <-line:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		l = "error: the holder did not start within 30s"
	}
	go cmd.Wait() // reap it when it ends (while this klient lives; then init does)
	if !strings.HasPrefix(l, "ok ") {
		if l == "" {
			l = "error the holder exited"
		}
		return nil, nil, fmt.Errorf("session holder: %s", strings.TrimPrefix(l, "error "))
	}
	hs, replay, err := m.dialHolder(spec.Socket)
	if err != nil {
		if pid, perr := strconv.Atoi(strings.TrimPrefix(l, "ok ")); perr == nil {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
		cmd.Process.Kill()
		return nil, nil, err
	}
	return hs, replay, nil
}

func (m *Manager) socketPath(id string) string { return filepath.Join(m.opts.SessionDir, id+".sock") }

// dialHolder connects to the holder at sock and reads its info and scrollback.
func (m *Manager) dialHolder(sock string) (*holderShell, []byte, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("session holder %s: %w", sock, err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	hs := &holderShell{m: m, sock: sock, conn: c}
	typ, p, err := readFrame(c)
	if err == nil && typ != frameInfo {
		err = fmt.Errorf("first frame %q, want info", typ)
	}
	if err == nil {
		err = json.Unmarshal(p, &hs.info)
	}
	var replay []byte
	if err == nil {
		typ, replay, err = readFrame(c)
		if err == nil && typ != frameReplay {
			err = fmt.Errorf("second frame %q, want the scrollback", typ)
		}
	}
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("session holder %s: %w", sock, err)
	}
	c.SetReadDeadline(time.Time{})
	return hs, replay, nil
}

func (h *holderShell) Read(p []byte) (int, error) {
	for len(h.pending) == 0 {
		typ, b, err := readFrame(h.conn)
		if err != nil {
			return 0, err
		}
		switch typ {
		case frameOutput:
			h.pending = b
		case frameExit:
			r := string(b)
			h.mu.Lock()
			h.exit = &r
			h.mu.Unlock()
			return 0, io.EOF
		}
	}
	n := copy(p, h.pending)
	h.pending = h.pending[n:]
	return n, nil
}

func (h *holderShell) send(typ byte, p []byte) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	return writeFrame(h.conn, typ, p)
}

func (h *holderShell) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), 32<<10)
		if err := h.send(frameInput, p[:k]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

func (h *holderShell) resize(cols, rows int) error {
	b, _ := json.Marshal(Size{Cols: cols, Rows: rows})
	return h.send(frameResize, b)
}

func (h *holderShell) rename(name string) { h.send(frameRename, []byte(name)) }

func (h *holderShell) pid() int { return h.info.PID }

// hangup asks the holder to end the shell; if it does not answer within grace and some, the
// connection is closed (the session ends; the holder, if alive, ends the shell itself).
func (h *holderShell) hangup(grace time.Duration, done <-chan struct{}) {
	b, _ := json.Marshal(killFrame{GraceMs: grace.Milliseconds()})
	if h.send(frameKill, b) != nil {
		h.conn.Close()
		return
	}
	go func() {
		t := time.NewTimer(grace + 5*time.Second)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			h.conn.Close()
		}
	}()
}

// stop leaves the holder running (klient is going away): it half-closes the connection, so the
// holder still gets what was sent (input, a rename) and then closes its side, which ends Read;
// a holder that does not within 2 s is cut off.
func (h *holderShell) stop() {
	h.mu.Lock()
	h.detaching = true
	h.mu.Unlock()
	h.wmu.Lock()
	err := h.conn.CloseWrite()
	h.wmu.Unlock()
	if err != nil {
		h.conn.Close()
		return
	}
	time.AfterFunc(2*time.Second, func() { h.conn.Close() })
}

// wait returns why the session ended once the reader stopped: the holder's reason (the holder
// is told it may go), or that the holder died; "" when klient detached.
func (h *holderShell) wait(readerDone <-chan struct{}) string {
	<-readerDone
	h.mu.Lock()
	exit, detaching := h.exit, h.detaching
	h.mu.Unlock()
	switch {
	case exit != nil:
		h.send(frameBye, nil)
		h.conn.Close()
		return *exit
	case detaching:
		return ""
	}
	h.conn.Close()
	// The holder died without saying goodbye (killed): its socket stays behind.
	if waitGone(h.info.HolderPID) {
		os.Remove(h.sock)
	}
	return fmt.Sprintf("session ended: its holder process (pid %d) exited", h.info.HolderPID)
}

// waitGone reports whether pid has ended (or is a zombie), waiting up to 2 s for it.
func waitGone(pid int) bool {
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// prepareSessionDir makes SessionDir (0700, klient's own) and refuses one others may enter.
func prepareSessionDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("session dir: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("session dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("session dir %s: not a directory of uid %d", dir, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("session dir: %w", err)
		}
	}
	return nil
}

// restore reconnects to the holders in SessionDir and restores their sessions; the sockets of
// holders that are gone are removed.
func (m *Manager) restore() error {
	if err := prepareSessionDir(m.opts.SessionDir); err != nil {
		return err
	}
	ents, err := os.ReadDir(m.opts.SessionDir)
	if err != nil {
		return fmt.Errorf("session dir: %w", err)
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".sock")
		if !ok || e.Type()&os.ModeSocket == 0 {
			continue
		}
		sock := filepath.Join(m.opts.SessionDir, e.Name())
		hs, replay, err := m.dialHolder(sock)
		if err != nil && holderGone(err) { // a holder dying as we look may still accept: look again
			time.Sleep(200 * time.Millisecond)
			hs, replay, err = m.dialHolder(sock)
		}
		if err != nil {
			if holderGone(err) {
				m.log.Info("webterm: removing the socket of a session holder that is gone", "socket", sock)
				os.Remove(sock)
			} else {
				m.log.Warn("webterm: session holder did not answer", "socket", sock, "err", err)
			}
			continue
		}
		if hs.info.Session != id {
			m.log.Warn("webterm: session holder answers for another session", "socket", sock, "session", hs.info.Session)
			hs.conn.Close()
			continue
		}
		hs.adopted = true
		s := newSession(m, id, hs.info.CreatedBy, hs.info.RunAs, hs.info.CreatedAt, hs, hs.info.PID, hs.info.Cols, hs.info.Rows)
		s.name = hs.info.Name
		s.lastOutput = hs.info.LastOutputAt
		s.ring.Write(replay)
		m.sessions[id] = s
		s.startIdle()
		go s.read()
		go s.wait()
		m.log.Info("webterm session restored", "session", id, "runAs", s.runAs, "pid", s.pid, "holder", hs.info.HolderPID, "replay", len(replay))
	}
	return nil
}

// AdoptedHolders returns the pids of the holders of sessions this Manager restored (started by
// an earlier klient, so not descendants of this process).
func (m *Manager) AdoptedHolders() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for _, s := range m.sessions {
		if hs, ok := s.sh.(*holderShell); ok && hs.adopted {
			out = append(out, hs.info.HolderPID)
		}
	}
	return out
}

// holderGone reports whether dialing a holder failed because nobody listens any more (rather
// than, say, a holder too busy to answer in time).
func holderGone(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
