// Package klientapi holds the wire types of klient's methods (docs/protocol.md, "klient" and
// "Web terminal"): method names, params and results, grants, terminal modes and close codes, and
// the framing constants of the terminal data path. Callers of klient (kloud, the CLI) import this
// package, not klient or klient/webterm, which are the agent and its PTY manager.
//
// Start with the method-name constants; each params or result type names its method.
package klientapi

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"time"

	"github.com/kloud-dev/kloud/userdata"
)

// Method names.
const (
	MethodInfo      = "klient.info"
	MethodLogs      = "klient.logs"
	MethodShare     = "klient.share"
	MethodUnshare   = "klient.unshare"
	MethodSetShares = "klient.setShares"
	MethodShared    = "klient.shared"

	MethodWebtermConnect = "webterm.connect"
	MethodWebtermList    = "webterm.list"
	MethodWebtermKill    = "webterm.kill"
	MethodWebtermRename  = "webterm.rename"
	MethodWebtermResize  = "webterm.resize"
)

// Info is the result of klient.info.
type Info struct {
	KiteID     string          `json:"kiteId"`
	Owner      string          `json:"owner"`
	Hostname   string          `json:"hostname"`
	OS         string          `json:"os"`
	Arch       string          `json:"arch"`
	Version    string          `json:"version"`
	StartedAt  time.Time       `json:"startedAt"`
	Provision  *ProvisionState `json:"provision,omitempty"`
	KontrolURL string          `json:"kontrolURL"`
	// Features lists what this klient does that older ones did not (kloud adapts to old agents).
	Features []string `json:"features,omitempty"`
	// SHA256 is the hex SHA-256 of the running klient's binary ("" if it could not be read):
	// kloud's agent rollout compares it with the binary it serves.
	SHA256 string `json:"sha256,omitempty"`
	// SSHHostKey is the machine's SSH host key, one authorized_keys line (FeatureSSH).
	SSHHostKey string `json:"sshHostKey,omitempty"`
}

// FeatureOwnAccountShells is in Info.Features of a klient whose terminal shares' shells run as
// the user's own account, not the owner's. kloud pushes terminal grants to klients without it as
// readonly.
const FeatureOwnAccountShells = "ownAccountShells"

// ProvisionState is what cloud-init's provisioning left on the machine (userdata's contract).
type ProvisionState struct {
	Provision  *userdata.ProvisionStatus  `json:"provision,omitempty"`
	UserScript *userdata.UserScriptStatus `json:"userScript,omitempty"`
}

// LogsParams are the params of klient.logs.
type LogsParams struct {
	// Name is one of cloud-init-output, provision, user-script, klient.
	Name string `json:"name"`
	// Bytes is how much of the end of the log to return (default 8 KiB, at most 1 MiB).
	Bytes int64 `json:"bytes,omitempty"`
}

// Validate implements kite.Validator.
func (p *LogsParams) Validate() error {
	if _, ok := LogPath(p.Name); !ok {
		return fmt.Errorf("unknown log %q: want cloud-init-output, provision, user-script or klient", p.Name)
	}
	if p.Bytes < 0 || p.Bytes > 1<<20 {
		return fmt.Errorf("bytes must be between 0 and 1 MiB")
	}
	return nil
}

// LogPath returns the file (under the machine's root) of the log klient.logs calls name.
func LogPath(name string) (string, bool) {
	switch name {
	case "cloud-init-output":
		return userdata.CloudInitOutputPath, true
	case "provision":
		return userdata.ProvisionLogPath, true
	case "user-script":
		return userdata.UserScriptLogPath, true
	case "klient":
		return userdata.KlientLogPath, true
	}
	return "", false
}

// LogsResult is the result of klient.logs.
type LogsResult struct {
	Name      string `json:"name"`
	Tail      string `json:"tail"`
	Truncated bool   `json:"truncated"`
}

// Grants a machine can be shared with.
const (
	GrantReadonly = "readonly" // watch terminals (read-only attach), list sessions
	GrantTerminal = "terminal" // and shells as the user's own account (no sudo): create, type, resize, kill/rename own sessions
	GrantFull     = "full"     // anything the owner can do on the machine (shells as the owner, with sudo; kill/rename any session, exec); not share
)

// ValidGrant reports whether g is one of the grants.
func ValidGrant(g string) bool { return g == GrantReadonly || g == GrantTerminal || g == GrantFull }

// Share is one entry of the access list.
type Share struct {
	Username string `json:"username"`
	Grant    string `json:"grant"`
}

// ShareParams are the params of klient.share.
type ShareParams struct {
	Username string `json:"username"`
	Grant    string `json:"grant"`
	Token    string `json:"token"`
}

// Validate implements kite.Validator.
func (p *ShareParams) Validate() error {
	if p.Username == "" {
		return errors.New("username is required")
	}
	if !ValidGrant(p.Grant) {
		return fmt.Errorf("grant %q: want %s, %s or %s", p.Grant, GrantReadonly, GrantTerminal, GrantFull)
	}
	return nil
}

// UnshareParams are the params of klient.unshare.
type UnshareParams struct {
	Username string `json:"username"`
	Token    string `json:"token"`
}

// Validate implements kite.Validator.
func (p *UnshareParams) Validate() error {
	if p.Username == "" {
		return errors.New("username is required")
	}
	return nil
}

// SetSharesParams are the params of klient.setShares.
type SetSharesParams struct {
	Shares []Share `json:"shares"`
	Token  string  `json:"token"`
}

// Validate implements kite.Validator.
func (p *SetSharesParams) Validate() error {
	seen := map[string]bool{}
	for _, s := range p.Shares {
		if s.Username == "" || !ValidGrant(s.Grant) {
			return fmt.Errorf("share %+v: username and a grant (%s, %s or %s) are required", s, GrantReadonly, GrantTerminal, GrantFull)
		}
		if seen[s.Username] {
			return fmt.Errorf("%s is listed twice", s.Username)
		}
		seen[s.Username] = true
	}
	return nil
}

// SharesResult is the result of klient.shared (and of the other share methods).
type SharesResult struct {
	Shares []Share `json:"shares"`
}

// Modes of Open (and of webterm.connect).
const (
	// ModeCreate starts a new session (with the given id, if any; it must not exist).
	ModeCreate = "create"
	// ModeAttach attaches to the session with the given id, creating it if it does not exist
	// (reattach-or-create: what a reloaded browser tab does).
	ModeAttach = "attach"
	// ModeShared joins an existing session, typing allowed (collaboration).
	ModeShared = "shared"
	// ModeReadonly joins an existing session to watch only.
	ModeReadonly = "readonly"
)

// WebSocket close codes of a terminal connection (docs/protocol.md, "Web terminal").
const (
	CloseNormal     = 1000 // the viewer detached
	CloseUnshared   = 4001 // the machine was unshared from the viewer's user (or the grant shrank)
	CloseEnded      = 4002 // the session ended: the shell exited, was killed, or was idle too long
	CloseTooSlow    = 4003 // the viewer did not take its output in time
	CloseAgentGone  = 4004 // kloud lost the machine's agent
	CloseRefused    = 4005 // webterm.connect failed; the reason says why
	CloseBadMessage = 4006 // a client frame broke the framing rules
)

// The data path (docs/protocol.md, "Web terminal"). Terminal bytes never travel as JSON-RPC:
// for each attachment klient dials a binary WebSocket to the URL kloud gave in webterm.connect
// (kloud's AttachPath, with a one-time ticket), and kloud relays it to the browser.
//
// Server → client binary frames are raw output bytes. Client → server binary frames start with
// an opcode byte: OpInput (bytes to type follow) or OpResize (JSON {"cols":N,"rows":N}
// follows); other opcodes are ignored. Frames are at most MaxFrame bytes each way. The server
// closes with a Close* code and a reason.
const (
	OpInput  byte = 0
	OpResize byte = 1
	// MaxFrame bounds one frame in either direction.
	MaxFrame = 64 << 10
	// AttachPath is where kloud accepts klient's side of an attachment (?ticket=...).
	AttachPath = "/kite/webterm/attach"
)

// Terminal sizes are 1..MaxCols by 1..MaxRows.
const MaxCols, MaxRows = 1000, 1000

// CheckSize checks a terminal size.
func CheckSize(cols, rows int) error {
	if cols < 1 || rows < 1 || cols > MaxCols || rows > MaxRows {
		return fmt.Errorf("terminal size %dx%d: cols and rows must be 1..%d", cols, rows, MaxCols)
	}
	return nil
}

var sessionID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ValidSessionID reports whether id may name a session: 1–64 of A-Z a-z 0-9 . _ -.
func ValidSessionID(id string) bool { return sessionID.MatchString(id) }

// DefaultMode is the mode an empty mode means.
func DefaultMode(session string) string {
	if session == "" {
		return ModeCreate
	}
	return ModeAttach
}

// Attach says where klient opens the data WebSocket of one attachment.
type Attach struct {
	URL    string `json:"url"`    // kloud's AttachPath on the origin klient reaches kontrol at
	Ticket string `json:"ticket"` // one-time, short-lived; sent as ?ticket=
}

// ConnectParams are the params of webterm.connect.
type ConnectParams struct {
	Session string `json:"session,omitempty"`
	Cols    int    `json:"cols"`
	Rows    int    `json:"rows"`
	Mode    string `json:"mode,omitempty"` // default: attach with a session, else create
	Token   string `json:"token"`          // kite token of the end user, aud = this klient
	Attach  Attach `json:"attach"`
}

// Validate implements kite.Validator.
func (p *ConnectParams) Validate() error {
	if err := CheckSize(p.Cols, p.Rows); err != nil {
		return err
	}
	if p.Session != "" && !ValidSessionID(p.Session) {
		return fmt.Errorf("session id %q: use 1-64 of A-Z a-z 0-9 . _ -", p.Session)
	}
	switch p.Mode {
	case "", ModeCreate, ModeAttach, ModeShared, ModeReadonly:
	default:
		return fmt.Errorf("mode %q: want %s, %s, %s or %s", p.Mode, ModeCreate, ModeAttach, ModeShared, ModeReadonly)
	}
	if (p.Mode == ModeShared || p.Mode == ModeReadonly) && p.Session == "" {
		return fmt.Errorf("mode %s needs a session", p.Mode)
	}
	if p.Attach.URL == "" || p.Attach.Ticket == "" {
		return errors.New("attach.url and attach.ticket are required")
	}
	return nil
}

// ConnectResult is the result of webterm.connect.
type ConnectResult struct {
	Session string `json:"session"`
	Mode    string `json:"mode"`    // create (a new session) or attach, shared, readonly
	Created bool   `json:"created"` // the session was started by this call
}

// TokenParams are the params of methods that take only the token (webterm.list,
// klient.shared).
type TokenParams struct {
	Token string `json:"token"`
}

// SessionParams are the params of webterm.kill.
type SessionParams struct {
	Session string `json:"session"`
	Token   string `json:"token"`
}

// Validate implements kite.Validator.
func (p *SessionParams) Validate() error {
	if p.Session == "" {
		return errors.New("session is required")
	}
	return nil
}

// RenameParams are the params of webterm.rename.
type RenameParams struct {
	Session string `json:"session"`
	Name    string `json:"name"`
	Token   string `json:"token"`
}

// Validate implements kite.Validator.
func (p *RenameParams) Validate() error {
	if p.Session == "" || p.Name == "" || len(p.Name) > 128 {
		return errors.New("session and name (1-128 bytes) are required")
	}
	return nil
}

// ResizeParams are the params of webterm.resize.
type ResizeParams struct {
	Session string `json:"session"`
	Cols    int    `json:"cols"`
	Rows    int    `json:"rows"`
	Token   string `json:"token"`
}

// Validate implements kite.Validator.
func (p *ResizeParams) Validate() error {
	if p.Session == "" {
		return errors.New("session is required")
	}
	if err := CheckSize(p.Cols, p.Rows); err != nil {
		return err
	}
	return nil
}

// ListResult is the result of webterm.list.
type ListResult struct {
	Sessions []SessionInfo `json:"sessions"`
}

// Size is the JSON of an OpResize frame.
type Size struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// SessionInfo describes a terminal session (webterm.list).
type SessionInfo struct {
	Session      string       `json:"session"`
	Name         string       `json:"name"`
	CreatedBy    string       `json:"createdBy"`
	RunAs        string       `json:"runAs"` // the machine account its shell runs as
	CreatedAt    time.Time    `json:"createdAt"`
	Cols         int          `json:"cols"`
	Rows         int          `json:"rows"`
	PID          int          `json:"pid"`
	LastOutputAt time.Time    `json:"lastOutputAt,omitzero"`
	Viewers      []ViewerInfo `json:"viewers"`
}

// ViewerInfo describes one attachment.
type ViewerInfo struct {
	User  string    `json:"user"`
	Mode  string    `json:"mode"`
	Since time.Time `json:"since"`
}

// CheckAttachURL accepts raw only if it is AttachPath on the same scheme and host as kontrolURL
// (klient dials nothing else: a caller cannot point it at another server).
func CheckAttachURL(raw, kontrolURL string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("attach url: %w", err)
	}
	k, err := url.Parse(kontrolURL)
	if err != nil {
		return nil, fmt.Errorf("kontrol url: %w", err)
	}
	scheme := func(s string) string {
		switch s {
		case "ws":
			return "http"
		case "wss":
			return "https"
		}
		return s
	}
	if scheme(u.Scheme) != scheme(k.Scheme) || u.Host != k.Host || u.Path != AttachPath || u.User != nil {
		return nil, fmt.Errorf("attach url %q: must be %s on kontrol's origin %s://%s", raw, AttachPath, k.Scheme, k.Host)
	}
	return u, nil
}
