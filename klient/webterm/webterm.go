// Package webterm is klient's web terminal: login shells in real PTYs, kept as sessions that
// outlive their connections, with many viewers each. A session's shell runs as one machine
// account for its whole life (Info.RunAs): the owner's, or a shared user's own (SharedAccount),
// and a writable viewer may join only a session of an account it may act as.
//
// Start with Manager (New, Open): Open creates or finds a session and attaches a Viewer, which
// gets the session's recent output (a bounded scrollback, replayed on every attach) and then
// everything it prints; Viewer.Input types into it unless the viewer is read-only. Serve
// (wire.go) carries one viewer over a binary WebSocket with the framing of docs/protocol.md
// ("Web terminal"); klient dials that WebSocket to kloud, which relays it to the browser.
//
// Flow control: each viewer has a bounded output queue. The PTY reader waits while a viewer's
// queue is full, so a producer like `yes` is slowed to what its viewers take instead of growing
// memory; a viewer that stays full for SlowViewerTimeout is dropped (CloseTooSlow) so it cannot
// hold the others back for longer. Input is written to the PTY directly, never behind output,
// so Ctrl-C works while output is backed up. Each session has its own goroutines: one session's
// flood does not slow another.
//
// Shells that outlive klient: with Options.SessionDir set, each session's PTY and shell live in
// a holder process of their own (holder.go: the holder and its framing; holderclient.go: klient's
// side), so klient can restart or be upgraded: Detach leaves the holders running and New finds
// them again (same shell, scrollback replayed). Without it, shells live in klient (procShell).
//
// Who may do what is decided by the caller (klient's ACL); the Manager enforces only what a
// viewer's mode means (read-only viewers cannot type or resize) and the per-user session limit.
package webterm

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
)

// The wire types and constants of the web terminal are package klientapi's; these names keep
// the Manager's API reading as before.
type (
	Info          = klientapi.SessionInfo
	ViewerInfo    = klientapi.ViewerInfo
	Attach        = klientapi.Attach
	ConnectParams = klientapi.ConnectParams
	ConnectResult = klientapi.ConnectResult
	TokenParams   = klientapi.TokenParams
	SessionParams = klientapi.SessionParams
	RenameParams  = klientapi.RenameParams
	ResizeParams  = klientapi.ResizeParams
	ListResult    = klientapi.ListResult
	Size          = klientapi.Size
)

// Modes of Open (klientapi's).
const (
	ModeCreate   = klientapi.ModeCreate
	ModeAttach   = klientapi.ModeAttach
	ModeShared   = klientapi.ModeShared
	ModeReadonly = klientapi.ModeReadonly
)

// Close codes of a terminal connection (klientapi's).
const (
	CloseNormal     = klientapi.CloseNormal
	CloseUnshared   = klientapi.CloseUnshared
	CloseEnded      = klientapi.CloseEnded
	CloseTooSlow    = klientapi.CloseTooSlow
	CloseRefused    = klientapi.CloseRefused
	CloseBadMessage = klientapi.CloseBadMessage
	// CloseGoingAway (WebSocket's 1001) closes the viewers of a session klient leaves to its
	// holder when it exits (Detach): the session lives on; reconnect.
	CloseGoingAway = 1001
)

// Framing of the data path (klientapi's).
const (
	OpInput    = klientapi.OpInput
	OpResize   = klientapi.OpResize
	MaxFrame   = klientapi.MaxFrame
	AttachPath = klientapi.AttachPath
)

// Defaults of Options.
const (
	DefaultScrollback         = 64 << 10
	DefaultIdleTimeout        = time.Hour
	DefaultMaxSessionsPerUser = 20
	DefaultViewerQueue        = 256 << 10
	DefaultSlowViewerTimeout  = 5 * time.Second
	DefaultKillGrace          = 3 * time.Second
	MaxCols, MaxRows          = klientapi.MaxCols, klientapi.MaxRows
)

// Options configure a Manager. Zero fields take the defaults above.
type Options struct {
	// Owner is the machine owner: sessions run as this account unless OpenRequest.RunAs names
	// another (required).
	Owner string
	// Root is where the machine's /etc/passwd and /etc/group are read (default "/").
	Root string
	// Scrollback is how much recent output a session keeps to replay on attach (64 KiB).
	Scrollback int
	// IdleTimeout ends a session that has had no viewer for this long (1 h).
	IdleTimeout time.Duration
	// MaxSessionsPerUser bounds the sessions one user may have created and not ended (20).
	MaxSessionsPerUser int
	// ViewerQueue bounds the output queued for one viewer, in bytes (256 KiB); when it is
	// full the session's reader waits.
	ViewerQueue int
	// SlowViewerTimeout is how long the reader waits for a full viewer before dropping it (5 s).
	SlowViewerTimeout time.Duration
	// KillGrace is how long a killed shell has between SIGHUP and SIGKILL (3 s).
	KillGrace time.Duration
	// SessionDir, if set, makes every session's PTY and shell live in a holder process of its
	// own (holder.go) that listens on SessionDir/ID.sock, so sessions outlive klient: New
	// reconnects to the holders it finds there, and Detach leaves them running. The directory
	// is made 0700 and must belong to klient's uid. Empty: shells live in klient and end with it.
	SessionDir string
	// HolderCommand is the program and leading arguments that start a holder; HolderArg and
	// the session id follow (default: this program, /proc/self/exe, whose main must call
	// HolderMain when its first argument is HolderArg).
	HolderCommand []string
	// HolderEnv is added to the holders' environment (internal/selfexec.Env, say).
	HolderEnv []string
	Logger    *slog.Logger
}

// Errors of the Manager, wrapping kite's sentinels so they map to protocol codes.
var (
	errNotFound = kite.ErrNotFound
	errReadOnly = fmt.Errorf("this viewer is read-only: %w", kite.ErrPermission)
)

// Manager owns the sessions of one machine.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	sessions map[string]*Session
	closed   bool
}

// New returns a Manager.
func New(o Options) (*Manager, error) {
	if o.Owner == "" {
		return nil, errors.New("webterm: Options.Owner is required")
	}
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Scrollback <= 0 {
		o.Scrollback = DefaultScrollback
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxSessionsPerUser <= 0 {
		o.MaxSessionsPerUser = DefaultMaxSessionsPerUser
	}
	if o.ViewerQueue <= 0 {
		o.ViewerQueue = DefaultViewerQueue
	}
	if o.SlowViewerTimeout <= 0 {
		o.SlowViewerTimeout = DefaultSlowViewerTimeout
	}
	if o.KillGrace <= 0 {
		o.KillGrace = DefaultKillGrace
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if len(o.HolderCommand) == 0 {
		o.HolderCommand = []string{"/proc/self/exe"}
	}
	m := &Manager{opts: o, log: o.Logger, sessions: map[string]*Session{}}
	if o.SessionDir != "" {
		if err := m.restore(); err != nil {
			return nil, fmt.Errorf("webterm: %w", err)
		}
	}
	return m, nil
}

// OpenRequest is what Open needs.
type OpenRequest struct {
	Session string // session id: optional for ModeCreate and ModeAttach
	User    string // who attaches (and creates, counted against their limit)
	Mode    string // a Mode* constant; "" means ModeAttach with a session, else ModeCreate
	// RunAs is the machine account a session created by this request runs as ("": the owner).
	// A writable attachment to an existing session needs the session to run as RunAs too,
	// unless AnyAccount is set (the owner, and full shares, may type into any session).
	RunAs      string
	AnyAccount bool
	Cols       int
	Rows       int
}

func checkSize(cols, rows int) error {
	if err := klientapi.CheckSize(cols, rows); err != nil {
		return fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	return nil
}

// Open creates or finds a session, as the mode says, and attaches a viewer to it. Writable
// viewers set the terminal size to theirs; read-only viewers leave it.
func (m *Manager) Open(r OpenRequest) (v *Viewer, created bool, err error) {
	if r.Mode == "" {
		r.Mode = klientapi.DefaultMode(r.Session)
	}
	if err := checkSize(r.Cols, r.Rows); err != nil {
		return nil, false, err
	}
	if r.Session != "" && !klientapi.ValidSessionID(r.Session) {
		return nil, false, fmt.Errorf("session id %q: use 1-64 of A-Z a-z 0-9 . _ -: %w", r.Session, kite.ErrInvalidParams)
	}
	if r.User == "" {
		return nil, false, fmt.Errorf("open: no user: %w", kite.ErrInvalidParams)
	}
	if r.RunAs == "" {
		r.RunAs = m.opts.Owner
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, false, fmt.Errorf("web terminals are shutting down: %w", kite.ErrState)
	}
	s := m.sessions[r.Session]
	switch r.Mode {
	case ModeCreate:
		if s != nil {
			m.mu.Unlock()
			return nil, false, fmt.Errorf("session %q exists: attach to it: %w", r.Session, kite.ErrConflict)
		}
	case ModeAttach:
	case ModeShared, ModeReadonly:
		if r.Session == "" {
			m.mu.Unlock()
			return nil, false, fmt.Errorf("mode %s needs a session: %w", r.Mode, kite.ErrInvalidParams)
		}
		if s == nil {
			m.mu.Unlock()
			return nil, false, fmt.Errorf("session %q: %w", r.Session, errNotFound)
		}
	default:
		m.mu.Unlock()
		return nil, false, fmt.Errorf("mode %q: want %s, %s, %s or %s: %w", r.Mode, ModeCreate, ModeAttach, ModeShared, ModeReadonly, kite.ErrInvalidParams)
	}
	if s == nil {
		s, err = m.createLocked(r)
		if err != nil {
			m.mu.Unlock()
			return nil, false, err
		}
		created = true
	}
	m.mu.Unlock()
	if r.Mode != ModeReadonly && !r.AnyAccount && s.runAs != r.RunAs {
		return nil, false, fmt.Errorf("session %q runs as %s, and %s may type only into sessions that run as %s (watch it read-only instead): %w",
			s.id, s.runAs, r.User, r.RunAs, kite.ErrPermission)
	}
	mode := r.Mode
	if mode == ModeCreate || mode == ModeAttach {
		mode = ModeAttach
		if created {
			mode = ModeCreate
		}
	}
	v, err = s.attach(r.User, mode)
	if err != nil {
		return nil, false, err
	}
	if !v.readonly {
		if err := s.Resize(r.Cols, r.Rows); err != nil {
			m.log.Warn("webterm resize on attach", "session", s.id, "err", err)
		}
	}
	return v, created, nil
}

func (m *Manager) createLocked(r OpenRequest) (*Session, error) {
	n := 0
	for _, s := range m.sessions {
		if s.createdBy == r.User {
			n++
		}
	}
	if n >= m.opts.MaxSessionsPerUser {
		return nil, fmt.Errorf("%s has %d terminal sessions, the limit: kill one first: %w", r.User, n, kite.ErrState)
	}
	id := r.Session
	if id == "" {
		id = rand.Text()[:16]
	}
	a, err := lookupAccount(m.opts.Root, r.RunAs)
	if err != nil {
		return nil, fmt.Errorf("web terminal: %w: %w", err, kite.ErrState)
	}
	s, err := startSession(m, id, r.User, a, r.Cols, r.Rows)
	if err != nil {
		return nil, fmt.Errorf("web terminal: %w", err)
	}
	m.sessions[id] = s
	m.log.Info("webterm session started", "session", id, "user", r.User, "runAs", a.Name, "shell", a.Shell, "pid", s.pid)
	return s, nil
}

func (m *Manager) forget(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions[s.id] == s {
		delete(m.sessions, s.id)
	}
}

func (m *Manager) get(id string) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sessions[id]
	if s == nil {
		return nil, fmt.Errorf("session %q: %w", id, errNotFound)
	}
	return s, nil
}

// Info describes the session id.
func (m *Manager) Info(id string) (Info, error) {
	s, err := m.get(id)
	if err != nil {
		return Info{}, err
	}
	return s.info(), nil
}

// List describes every session, oldest first.
func (m *Manager) List() []Info {
	m.mu.Lock()
	ss := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	out := make([]Info, 0, len(ss))
	for _, s := range ss {
		out = append(out, s.info())
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].Session < out[j].Session
	})
	return out
}

// Kill ends the session: its viewers get CloseEnded with reason. It returns once the session
// is gone (the shell may linger up to KillGrace before SIGKILL).
func (m *Manager) Kill(id, reason string) error {
	s, err := m.get(id)
	if err != nil {
		return err
	}
	s.kill(reason)
	<-s.done
	return nil
}

// Rename sets the session's display name.
func (m *Manager) Rename(id, name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("session name must be 1-128 bytes: %w", kite.ErrInvalidParams)
	}
	s, err := m.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.name = name
	s.mu.Unlock()
	s.sh.rename(name)
	return nil
}

// Resize sets the session's terminal size.
func (m *Manager) Resize(id string, cols, rows int) error {
	s, err := m.get(id)
	if err != nil {
		return err
	}
	return s.Resize(cols, rows)
}

// CloseViewers ends the viewers of user for which drop returns true (nil: all of them) with
// code and reason, at once, dropping their queued output. It returns how many it closed.
func (m *Manager) CloseViewers(user string, drop func(*Viewer) bool, code int, reason string) int {
	m.mu.Lock()
	ss := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	n := 0
	for _, s := range ss {
		s.mu.Lock()
		vs := s.viewers
		s.mu.Unlock()
		for _, v := range vs {
			if v.user == user && (drop == nil || drop(v)) {
				v.close(code, reason, true)
				n++
			}
		}
	}
	return n
}

// KillRunAs ends every session whose shell runs as account (its viewers get CloseEnded with
// reason) and returns how many it ended.
func (m *Manager) KillRunAs(account, reason string) int {
	m.mu.Lock()
	var ss []*Session
	for _, s := range m.sessions {
		if s.runAs == account {
			ss = append(ss, s)
		}
	}
	m.mu.Unlock()
	for _, s := range ss {
		s.kill(reason)
	}
	for _, s := range ss {
		<-s.done
	}
	return len(ss)
}

// Detach refuses new sessions and lets go of the existing ones without ending their shells,
// which live on in their holders for the next klient (New with the same SessionDir); their
// viewers are closed. Without a SessionDir it is Close.
func (m *Manager) Detach() {
	if m.opts.SessionDir == "" {
		m.Close()
		return
	}
	ss := m.shut()
	for _, s := range ss {
		s.letGo()
	}
	for _, s := range ss {
		<-s.done
	}
}

// Close kills every session (and its holder) and refuses new ones.
func (m *Manager) Close() {
	ss := m.shut()
	for _, s := range ss {
		s.kill("session ended: klient is shutting down")
	}
	for _, s := range ss {
		<-s.done
	}
}

// shut refuses new sessions and returns the existing ones.
func (m *Manager) shut() []*Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	ss := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		ss = append(ss, s)
	}
	return ss
}
