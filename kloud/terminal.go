package kloud

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/store"
)

// Web terminals. The browser (and `kloud ssh`) reach a machine's terminal through kloud, never
// the machine directly:
//
//	GET    /api/machines/{id}/terminal?session=&mode=&cols=&rows=   WebSocket (the terminal)
//	GET    /api/machines/{id}/sessions                              {sessions: [klientapi.SessionInfo]}
//	DELETE /api/machines/{id}/sessions/{session}                    kill
//	POST   /api/machines/{id}/sessions/{session}/rename {name}      rename
//	GET    /kite/webterm/attach?ticket=                             klient's side (WebSocket)
//
// Requests authenticate with the kloud_session cookie, or "Authorization: Bearer <session or
// kite key>" (the CLI); WebSocket upgrades must be same-origin. kloud authorises the user for
// the machine (its owner, or a user it is shared with, as the machine's grant allows), mints a
// short token for that user and the machine's klient, and calls webterm.connect over the
// agent's registration connection with a one-time ticket; klient dials the attach endpoint with
// it, and kloud relays that WebSocket and the browser's, frame by frame, both ways. klient
// checks the token against its own access list too. Once attached, kloud sends the browser one
// text frame, JSON {session, mode, created}; every other frame is the terminal's. The framing
// and close codes are docs/protocol.md "Web terminal".

// Limits of the terminal endpoints.
const (
	ticketTTL         = 30 * time.Second // a ticket not used by then is forgotten
	terminalTokenTTL  = time.Minute      // the user's token klient checks in webterm.* calls
	relayPingInterval = 30 * time.Second // keeps idle terminals alive behind proxies
)

func newTermHub(s *Server) *termHub {
	return &termHub{s: s, pending: map[string]chan *websocket.Conn{}, relays: map[*relay]struct{}{}}
}

// closeTerminals closes every web terminal when ctx ends (shutdown).
func (s *Server) closeTerminals(ctx context.Context) {
	<-ctx.Done()
	s.term.closeAll()
}

// termHub pairs klient's attachments with the browsers waiting for them.
type termHub struct {
	s       *Server
	mu      sync.Mutex
	pending map[string]chan *websocket.Conn // ticket → the terminal request waiting for klient
	relays  map[*relay]struct{}
	closed  bool
}

// httpError is an error with the HTTP status it answers.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// httpCaller authenticates an HTTP request: a session (cookie or bearer) or a user's kite key
// (bearer). Machine agents' keys are refused.
func (s *Server) httpCaller(r *http.Request) (*Caller, error) {
	raw := requestSession(r)
	if raw == "" {
		return nil, &httpError{http.StatusUnauthorized, "not logged in: POST /api/login, or send Authorization: Bearer <session or kite key>"}
	}
	v := s.Kontrol.Verifier()
	sess, err := v.Session(r.Context(), raw)
	if err == nil {
		return s.callerByName(r.Context(), sess.Subject, sess.Admin)
	}
	if errors.Is(err, kitekey.ErrWrongKind) {
		kk, kerr := v.KiteKey(r.Context(), raw)
		if kerr == nil {
			if strings.HasPrefix(kk.ID, AgentKitePrefix) {
				return nil, &httpError{http.StatusForbidden, "machine agents may not open terminals"}
			}
			return s.callerByName(r.Context(), kk.Subject, false)
		}
		err = kerr
	}
	return nil, &httpError{http.StatusUnauthorized, "credential not accepted: " + err.Error()}
}

// machineRole is what c may do on m: "owner", a share grant, or "" (nothing: kloud admins and
// team admins too, klient would refuse them).
func machineRole(c *Caller, m *Machine) string {
	if m.Owner == c.Username {
		return "owner"
	}
	for _, sh := range m.Shares {
		if sh.Username == c.Username {
			return sh.Grant
		}
	}
	return ""
}

// termTarget authenticates the request and loads the machine it names, which the caller must
// be able to use a terminal on. On an error after the caller is known, it returns the caller
// too (for the audit log).
func (s *Server) termTarget(r *http.Request) (*Caller, *Machine, string, error) {
	c, err := s.httpCaller(r)
	if err != nil {
		return nil, nil, "", err
	}
	m, err := s.loadMachine(r.Context(), c, r.PathValue("id"))
	if err != nil {
		if errors.Is(err, kite.ErrNotFound) {
			return c, nil, "", &httpError{http.StatusNotFound, err.Error()}
		}
		return c, nil, "", err
	}
	role := machineRole(c, m)
	if role == "" {
		return c, nil, "", &httpError{http.StatusForbidden, fmt.Sprintf("machine %s is not shared with %s: only its owner and users it is shared with open terminals", m.Label, c.Username)}
	}
	return c, m, role, nil
}

// writeErr answers err as JSON with the status it maps to.
func (s *Server) writeErr(w http.ResponseWriter, err error) {
	var he *httpError
	if errors.As(err, &he) {
		writeError(w, he.code, he.msg)
		return
	}
	code, err := errStatus(err)
	writeError(w, code, err.Error())
}

// errStatus is the HTTP status of an error that is not an httpError, and the error with its
// kite code (wireError).
func errStatus(err error) (int, error) {
	err = wireError(err)
	code := http.StatusBadGateway
	switch {
	case errors.Is(err, kite.ErrInvalidParams):
		code = http.StatusBadRequest
	case errors.Is(err, kite.ErrAuth), errors.Is(err, kite.ErrPermission):
		code = http.StatusForbidden
	case errors.Is(err, kite.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, kite.ErrConflict), errors.Is(err, kite.ErrState):
		code = http.StatusConflict
	case errors.Is(err, kite.ErrStoreUnavailable): // before timeouts: it wraps the driver's deadline
		code = http.StatusServiceUnavailable
	case errors.Is(err, kite.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		code = http.StatusGatewayTimeout
	}
	return code, err
}

// userToken mints the token klient checks: the user, for this machine's klient only.
func (s *Server) userToken(c *Caller, m *Machine) (string, error) {
	return s.Signer().Token(c.Username, m.KiteID, terminalTokenTTL)
}

// attachURL is the attach endpoint on the origin the machine's klient reaches kloud at (the
// one klient accepts: its kontrol's).
func (s *Server) attachURL(m *Machine) string {
	base := s.opts.PublicURL
	if p, err := s.providers.Lookup(m.Provider); err == nil {
		base = s.kloudURLFor(p)
	}
	return strings.TrimRight(base, "/") + klientapi.AttachPath
}

// sameOrigin accepts requests without an Origin (not a browser) and browsers on this host.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}

// terminalRequest is the query of the terminal endpoint.
func terminalRequest(r *http.Request, role string) (klientapi.ConnectParams, error) {
	q := r.URL.Query()
	p := klientapi.ConnectParams{Session: q.Get("session"), Mode: q.Get("mode"), Cols: 80, Rows: 24,
		Attach: klientapi.Attach{URL: "-", Ticket: "-"}}
	for _, f := range []struct {
		name string
		v    *int
	}{{"cols", &p.Cols}, {"rows", &p.Rows}} {
		if s := q.Get(f.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				return p, &httpError{http.StatusBadRequest, f.name + " must be a number"}
			}
			*f.v = n
		}
	}
	if p.Mode == "" {
		p.Mode = klientapi.DefaultMode(p.Session)
		if role == GrantReadonly {
			p.Mode = klientapi.ModeReadonly
		}
	}
	if err := p.Validate(); err != nil {
		return p, &httpError{http.StatusBadRequest, err.Error()}
	}
	if role == GrantReadonly && p.Mode != klientapi.ModeReadonly {
		return p, &httpError{http.StatusForbidden, "a read-only share opens terminals with mode=readonly only"}
	}
	return p, nil
}

func (h *termHub) serveTerminal(w http.ResponseWriter, r *http.Request) {
	s := h.s
	c, m, role, err := s.termTarget(r)
	target := "machine/" + r.PathValue("id")
	// The audit log records every attempt of a known user (audit.go), and each session's end.
	refused := func(err error) {
		if c != nil {
			s.auditHTTP(r, auditTerminalOpen, c.Username, target, auditStatus(err))
		}
	}
	if err != nil {
		refused(err)
		s.writeErr(w, err)
		return
	}
	p, err := terminalRequest(r, role)
	if err != nil {
		refused(err)
		s.writeErr(w, err)
		return
	}
	if !sameOrigin(r) {
		refused(&httpError{http.StatusForbidden, "cross-origin"})
		writeError(w, http.StatusForbidden, "cross-origin terminal requests are refused")
		return
	}
	browser, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.log.DebugContext(r.Context(), "terminal: websocket accept", "err", err)
		return
	}
	browser.SetReadLimit(klientapi.MaxFrame)
	log := s.log.With("machine", m.ID, "user", c.Username)

	agent, err := s.agentConn(m)
	if err != nil {
		refused(err)
		browser.Close(klientapi.CloseAgentGone, closeReason(err))
		return
	}
	klient, res, err := h.connect(r.Context(), agent, c, m, p)
	if err != nil {
		refused(err)
		log.Info("terminal refused", "err", err)
		browser.Close(klientapi.CloseRefused, closeReason(err))
		return
	}
	log.Info("terminal opened", "session", res.Session, "mode", res.Mode, "created", res.Created)
	s.auditHTTP(r, auditTerminalOpen, c.Username, target, http.StatusOK)
	s.touch(m.ID) // idle.go: attaching is activity
	opened := time.Now()
	// One text frame tells the browser what it is attached to; the rest is binary output.
	notice, _ := json.Marshal(res)
	wctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	err = browser.Write(wctx, websocket.MessageText, notice)
	cancel()
	if err != nil {
		browser.CloseNow()
		klient.Close(websocket.StatusNormalClosure, "the browser went away")
		return
	}
	rl := h.start(browser, klient, m.ID)
	if rl == nil {
		return
	}
	if res.Mode != klientapi.ModeReadonly {
		rl.onInput = func() { s.touch(m.ID) } // idle.go: typing is activity
	}
	rl.run()
	log.Info("terminal closed", "session", res.Session, "reason", rl.reason)
	s.audit(r.Context(), store.AuditEntry{Action: auditTerminalClose, User: c.Username, Remote: clientIP(r), Target: target,
		Result: store.AuditOK, Duration: time.Since(opened).Milliseconds(), Bytes: rl.bytes.Load()}, nil)
}

// connect asks the machine's klient for an attachment and returns klient's WebSocket for it.
func (h *termHub) connect(ctx context.Context, agent *kite.Conn, c *Caller, m *Machine, p klientapi.ConnectParams) (*websocket.Conn, klientapi.ConnectResult, error) {
	var res klientapi.ConnectResult
	tok, err := h.s.userToken(c, m)
	if err != nil {
		return nil, res, err
	}
	ticket, ch := h.newTicket()
	defer h.dropTicket(ticket)
	p.Token, p.Attach = tok, klientapi.Attach{URL: h.s.attachURL(m), Ticket: ticket}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := agent.Call(cctx, klientapi.MethodWebtermConnect, p, &res); err != nil {
		select {
		case ws := <-ch: // klient dialed, then gave up
			ws.CloseNow()
		default:
		}
		return nil, res, err
	}
	select {
	case ws := <-ch:
		return ws, res, nil
	case <-cctx.Done():
		return nil, res, fmt.Errorf("klient attached session %s but its connection never arrived: %w", res.Session, kite.ErrTimeout)
	}
}

func (h *termHub) newTicket() (string, chan *websocket.Conn) {
	t := rand.Text()
	ch := make(chan *websocket.Conn, 1)
	h.mu.Lock()
	h.pending[t] = ch
	h.mu.Unlock()
	time.AfterFunc(ticketTTL, func() { h.dropTicket(t) })
	return t, ch
}

func (h *termHub) dropTicket(t string) {
	h.mu.Lock()
	delete(h.pending, t)
	h.mu.Unlock()
}

// serveAttach takes klient's side of an attachment: the ticket (one-time) names the terminal
// request waiting for it.
func (h *termHub) serveAttach(w http.ResponseWriter, r *http.Request) {
	t := r.URL.Query().Get("ticket")
	h.mu.Lock()
	ch := h.pending[t]
	delete(h.pending, t)
	h.mu.Unlock()
	if ch == nil || t == "" {
		writeError(w, http.StatusForbidden, "unknown, used or expired ticket")
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(klientapi.MaxFrame)
	ch <- ws // buffered; the waiter takes it or drops the ticket's channel
}

// relay copies frames between a browser and klient; each direction holds at most one frame,
// so a slow reader on either side pushes back to the writer (and, on klient's side, to the
// PTY).
type relay struct {
	h               *termHub
	browser, klient *websocket.Conn
	ctx             context.Context
	cancel          context.CancelFunc
	once            sync.Once
	reason          string
	bytes           atomic.Int64 // relayed both ways (message payloads)
	machine         string       // the machine's id
	onInput         func()       // called on each input frame from the browser (nil: none)
}

func (h *termHub) start(browser, klient *websocket.Conn, machine string) *relay {
	ctx, cancel := context.WithCancel(context.Background())
	rl := &relay{h: h, browser: browser, klient: klient, ctx: ctx, cancel: cancel, machine: machine}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		cancel()
		browser.Close(websocket.StatusGoingAway, "kloud is shutting down")
		klient.Close(websocket.StatusGoingAway, "kloud is shutting down")
		return nil
	}
	h.relays[rl] = struct{}{}
	h.mu.Unlock()
	return rl
}

// run relays until either side ends, then closes the other with the same code and reason.
func (rl *relay) run() {
	defer func() {
		rl.h.mu.Lock()
		delete(rl.h.relays, rl)
		rl.h.mu.Unlock()
		rl.cancel()
	}()
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		out := rl.h.s.metrics.termBytes.WithLabelValues("out")
		err := copyFrames(rl.ctx, rl.browser, rl.klient, false, nil, func(n int) { rl.bytes.Add(int64(n)); out.Add(float64(n)) })
		code, reason := websocket.CloseStatus(err), closeText(err)
		if code == -1 || code == websocket.StatusAbnormalClosure {
			code, reason = klientapi.CloseAgentGone, "lost the connection to the machine's agent"
		}
		rl.end(rl.browser, code, reason)
		rl.klient.CloseNow()
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		in := rl.h.s.metrics.termBytes.WithLabelValues("in")
		err := copyFrames(rl.ctx, rl.klient, rl.browser, true, rl.onInput, func(n int) { rl.bytes.Add(int64(n)); in.Add(float64(n)) })
		var code websocket.StatusCode = websocket.StatusNormalClosure
		reason := "the browser went away"
		if ce := websocket.CloseStatus(err); ce == klientapi.CloseBadMessage || ce == websocket.StatusUnsupportedData || ce == websocket.StatusMessageTooBig {
			code, reason = ce, closeText(err)
		}
		rl.end(rl.klient, code, reason)
	}()
	go rl.keepalive()
	<-done
	<-done
}

// end closes c with code and reason (once per relay: the first side to end decides).
func (rl *relay) end(c *websocket.Conn, code websocket.StatusCode, reason string) {
	rl.once.Do(func() { rl.reason = fmt.Sprintf("%d %s", code, reason) })
	c.Close(code, truncateUTF8(reason, 123))
}

func (rl *relay) keepalive() {
	t := time.NewTicker(relayPingInterval)
	defer t.Stop()
	for {
		select {
		case <-rl.ctx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(rl.ctx, relayPingInterval/2)
			err := rl.browser.Ping(ctx)
			cancel()
			if err != nil && rl.ctx.Err() == nil {
				rl.browser.CloseNow()
				return
			}
		}
	}
}

// copyFrames copies messages from src to dst until src ends, with one frame's buffer, telling
// relayed the size of each frame it relayed (the audit entry's bytes, metrics.go's counters).
// fromBrowser frames must be binary with an opcode byte (the rest klient checks); onInput, if
// set, is called for each input frame (opcode 0).
func copyFrames(ctx context.Context, dst, src *websocket.Conn, fromBrowser bool, onInput func(), relayed func(n int)) error {
	buf := make([]byte, klientapi.MaxFrame+1) // the read limit is MaxFrame: a message always ends before
	for {
		typ, r, err := src.Reader(ctx)
		if err != nil {
			return err
		}
		n, err := io.ReadFull(r, buf)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return err
		}
		if fromBrowser && (typ != websocket.MessageBinary || n == 0) {
			return websocket.CloseError{Code: klientapi.CloseBadMessage, Reason: "send binary frames that start with an opcode byte"}
		}
		if fromBrowser && onInput != nil && buf[0] == 0 {
			onInput()
		}
		if err := dst.Write(ctx, typ, buf[:n]); err != nil {
			return err
		}
		relayed(n)
	}
}

// sessions is how many terminals are relayed now (metrics.go).
func (h *termHub) sessions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.relays)
}

func closeText(err error) string {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// closeReason fits an error into a close frame.
func closeReason(err error) string { return truncateUTF8(err.Error(), 123) }

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && s[len(s)-1]&0xC0 == 0x80 {
		s = s[:len(s)-1]
	}
	if len(s) > 0 && s[len(s)-1] >= 0xC0 {
		s = s[:len(s)-1]
	}
	return s
}

// notice writes text to the terminals attached to machine id through this kloud, as output
// (the idle stop's warning); it returns how many it reached.
func (h *termHub) notice(id, text string) int {
	h.mu.Lock()
	var rs []*relay
	for rl := range h.relays {
		if rl.machine == id {
			rs = append(rs, rl)
		}
	}
	h.mu.Unlock()
	n := 0
	for _, rl := range rs {
		ctx, cancel := context.WithTimeout(rl.ctx, 5*time.Second)
		if rl.browser.Write(ctx, websocket.MessageBinary, []byte(text)) == nil {
			n++
		}
		cancel()
	}
	return n
}

// closeAll ends every relay (kloud is shutting down) and refuses new ones.
func (h *termHub) closeAll() {
	h.mu.Lock()
	h.closed = true
	rs := make([]*relay, 0, len(h.relays))
	for rl := range h.relays {
		rs = append(rs, rl)
	}
	h.mu.Unlock()
	for _, rl := range rs {
		rl.cancel()
		rl.browser.Close(websocket.StatusGoingAway, "kloud is shutting down")
		rl.klient.Close(websocket.StatusGoingAway, "kloud is shutting down")
	}
}

// agentCall calls a webterm method on the machine's klient for the caller.
func (h *termHub) agentCall(ctx context.Context, c *Caller, m *Machine, method string, params func(token string) any, res any) error {
	agent, err := h.s.agentConn(m)
	if err != nil {
		return err
	}
	tok, err := h.s.userToken(c, m)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return agent.Call(ctx, method, params(tok), res)
}

func (h *termHub) serveSessions(w http.ResponseWriter, r *http.Request) {
	c, m, _, err := h.s.termTarget(r)
	if err != nil {
		h.s.writeErr(w, err)
		return
	}
	var res klientapi.ListResult
	if err := h.agentCall(r.Context(), c, m, klientapi.MethodWebtermList, func(tok string) any { return klientapi.TokenParams{Token: tok} }, &res); err != nil {
		h.s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (h *termHub) serveKill(w http.ResponseWriter, r *http.Request) {
	c, m, _, err := h.s.termTarget(r)
	if err == nil {
		sess := r.PathValue("session")
		if err = h.agentCall(r.Context(), c, m, klientapi.MethodWebtermKill, func(tok string) any { return klientapi.SessionParams{Session: sess, Token: tok} }, nil); err == nil {
			writeJSON(w, http.StatusOK, map[string]string{"session": sess})
		}
	}
	if c != nil { // audit.go
		h.s.auditHTTP(r, auditTerminalKill, c.Username, "machine/"+r.PathValue("id"), auditStatusOf(err))
	}
	if err != nil {
		h.s.writeErr(w, err)
	}
}

func (h *termHub) serveRename(w http.ResponseWriter, r *http.Request) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, `send {"name": "..."} as application/json`)
		return
	}
	c, m, _, err := h.s.termTarget(r)
	if err != nil {
		h.s.writeErr(w, err)
		return
	}
	var body struct {
		Name string `json:"name"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Name == "" {
		writeError(w, http.StatusBadRequest, `body must be {"name": "..."}`)
		return
	}
	sess := r.PathValue("session")
	var info klientapi.SessionInfo
	err = h.agentCall(r.Context(), c, m, klientapi.MethodWebtermRename, func(tok string) any {
		return klientapi.RenameParams{Session: sess, Name: body.Name, Token: tok}
	}, &info)
	h.s.auditHTTP(r, auditTerminalRename, c.Username, "machine/"+m.ID, auditStatusOf(err)) // audit.go
	if err != nil {
		h.s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}
