package webterm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"
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
	if err := checkSize(p.Cols, p.Rows); err != nil {
		return errors.New(strings.TrimSuffix(err.Error(), ": invalid params"))
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
	if err := checkSize(p.Cols, p.Rows); err != nil {
		return errors.New(strings.TrimSuffix(err.Error(), ": invalid params"))
	}
	return nil
}

// ListResult is the result of webterm.list.
type ListResult struct {
	Sessions []Info `json:"sessions"`
}

// Size is the JSON of an OpResize frame.
type Size struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
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

// Dial opens klient's side of an attachment: a WebSocket to a.URL with the ticket.
func Dial(ctx context.Context, a Attach, kontrolURL string) (*websocket.Conn, error) {
	u, err := CheckAttachURL(a.URL, kontrolURL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("ticket", a.Ticket)
	u.RawQuery = q.Encode()
	ws, resp, err := websocket.Dial(ctx, u.String(), nil)
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("dial %s%s: %s: %w", u.Host, u.Path, resp.Status, err)
		}
		return nil, fmt.Errorf("dial %s%s: %w", u.Host, u.Path, err)
	}
	ws.SetReadLimit(MaxFrame)
	return ws, nil
}

// ServeOptions tune Serve.
type ServeOptions struct {
	// PingInterval keeps the connection alive through proxies and notices a dead peer
	// (default 30 s; the peer must answer within PingInterval/2).
	PingInterval time.Duration
	// WriteGrace is how long a viewer that ended may take to finish the frame it is writing
	// before the connection is cut (default 5 s).
	WriteGrace time.Duration
	Logger     *slog.Logger
}

// Serve carries viewer v over ws until either ends, then closes ws with the viewer's end code
// and reason (and detaches v).
func Serve(ctx context.Context, ws *websocket.Conn, v *Viewer, o ServeOptions) {
	if o.PingInterval <= 0 {
		o.PingInterval = 30 * time.Second
	}
	if o.WriteGrace <= 0 {
		o.WriteGrace = 5 * time.Second
	}
	log := o.Logger
	if log == nil {
		log = v.s.m.log
	}
	log = log.With("session", v.s.id, "user", v.user)
	ws.SetReadLimit(MaxFrame)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	finished := make(chan struct{})
	defer close(finished)

	// Input: never waits behind output.
	go func() {
		for {
			typ, b, err := ws.Read(ctx)
			if err != nil {
				v.Close()
				return
			}
			if typ != websocket.MessageBinary || len(b) == 0 {
				v.close(CloseBadMessage, "send binary frames that start with an opcode byte", true)
				return
			}
			switch b[0] {
			case OpInput:
				err = v.Input(b[1:])
			case OpResize:
				var sz Size
				if err = json.Unmarshal(b[1:], &sz); err == nil {
					err = v.Resize(sz.Cols, sz.Rows)
				}
			default:
				continue
			}
			if err != nil && !errors.Is(err, errReadOnly) {
				log.Debug("webterm input", "err", err)
			}
		}
	}()
	// Keepalive.
	go func() {
		t := time.NewTicker(o.PingInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				pctx, pcancel := context.WithTimeout(ctx, o.PingInterval/2)
				err := ws.Ping(pctx)
				pcancel()
				if err != nil && ctx.Err() == nil {
					v.close(CloseNormal, "peer did not answer ping", true)
					return
				}
			case <-finished:
				return
			}
		}
	}()
	// Output writes may block on a slow peer; once the viewer has ended they get WriteGrace.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() {
		select {
		case <-v.Done():
		case <-finished:
			return
		}
		t := time.NewTimer(o.WriteGrace)
		defer t.Stop()
		select {
		case <-t.C:
			wcancel()
		case <-finished:
		}
	}()

	buf := make([]byte, MaxFrame)
	for {
		n, err := v.Next(ctx, buf)
		if err != nil {
			end := v.Err()
			if end == nil { // ctx ended: klient is going away
				v.Close()
				ws.Close(websocket.StatusGoingAway, "klient is shutting down")
				return
			}
			ws.Close(websocket.StatusCode(end.Code), truncateReason(end.Reason))
			return
		}
		if err := ws.Write(wctx, websocket.MessageBinary, buf[:n]); err != nil {
			v.Close()
			ws.CloseNow()
			return
		}
	}
}

// truncateReason fits a close reason into a control frame (125 bytes with the code).
func truncateReason(s string) string {
	if len(s) <= 123 {
		return s
	}
	s = s[:123]
	for len(s) > 0 && s[len(s)-1]&0xC0 == 0x80 {
		s = s[:len(s)-1]
	}
	if len(s) > 0 && s[len(s)-1] >= 0xC0 {
		s = s[:len(s)-1]
	}
	return s
}
