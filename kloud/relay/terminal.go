package relay

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kloud-dev/kloud/internal/tunnel"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/model"
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

	// klient's side of a relay is pinged every klientPingInterval: one not answered within
	// klientPingTimeout is a cut link (no FIN, no RST: TCP alone would notice in minutes), and
	// the browser is told at once (4004) instead of showing "connected" for the cut's length.
	// A cut is found within their sum, 10s, under kontrol's heartbeat timeout (15s + 10s).
	klientPingInterval = 5 * time.Second
	klientPingTimeout  = 5 * time.Second
	// The ping that confirms input goes once input paused for inputQuiet, or inputMaxWait after
	// the first input it confirms while input goes on. Sent at once after each input frame, it
	// met the keystroke's echo on the way (and the next keystroke, when typing is fast): it cost
	// every echo 70 µs at p50 and 400 µs at p99 (bench/webterm). A cut can leave input of that
	// long more unconfirmed (sent again on reattach).
	inputQuiet   = 5 * time.Millisecond
	inputMaxWait = 100 * time.Millisecond
	// agentWait is how long a terminal request whose machine's agent is not connected (or
	// whose connection just died) waits for it, telling the browser {"unreachable"} meanwhile,
	// before it closes with 4004: a page that reattaches after a network cut is attached the
	// moment klient is back, instead of at its next retry.
	agentWait = 30 * time.Second
	// agentPoll is how often that wait looks for the agent.
	agentPoll = 100 * time.Millisecond
)

// terminalNotice is a text frame of the terminal endpoint other than the attach notice
// (klientapi.ConnectResult, {session, mode, created}); docs/protocol.md "Web terminal".
type terminalNotice struct {
	// Unreachable: the machine's agent is not connected (a network cut, a restarting klient);
	// kloud waits for it and attaches then (the attach notice follows), or closes with 4004.
	Unreachable string `json:"unreachable,omitempty"`
	// Confirmed counts the input bytes of this connection that klient has received (a ping
	// sent after them was answered). A client keeps what it typed past that count, and when the
	// connection is lost sends it again on its next attachment: no keystroke is lost silently.
	Confirmed int64 `json:"confirmed,omitempty"`
}

// mayTerminal says whether user may use terminals on m: its owner or a user it is shared with.
func mayTerminal(user string, m *model.Machine) error {
	if Role(user, m) == "" {
		return fmt.Errorf("machine %s is not shared with %s: only its owner and users it is shared with open terminals", m.Label, user)
	}
	return nil
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
				return p, &statusError{http.StatusBadRequest, f.name + " must be a number"}
			}
			*f.v = n
		}
	}
	if p.Mode == "" {
		p.Mode = klientapi.DefaultMode(p.Session)
		if role == model.GrantReadonly {
			p.Mode = klientapi.ModeReadonly
		}
	}
	if err := p.Validate(); err != nil {
		return p, &statusError{http.StatusBadRequest, err.Error()}
	}
	if role == model.GrantReadonly && p.Mode != klientapi.ModeReadonly {
		return p, &statusError{http.StatusForbidden, "a read-only share opens terminals with mode=readonly only"}
	}
	return p, nil
}

// ServeTerminal is GET /api/machines/{id}/terminal: the terminal, a WebSocket.
func (h *Hub) ServeTerminal(w http.ResponseWriter, r *http.Request) {
	user, m, err := h.target(r, mayTerminal)
	target := "machine/" + r.PathValue("id")
	// The audit log records every attempt of a known user, and each session's end.
	refused := func(err error) {
		if user != "" {
			h.attempt(r, ActionTerminalOpen, user, target, Status(err))
		}
	}
	if err != nil {
		refused(err)
		writeErr(w, err)
		return
	}
	p, err := terminalRequest(r, Role(user, m))
	if err != nil {
		refused(err)
		writeErr(w, err)
		return
	}
	if !h.sameOrigin(r) {
		refused(&statusError{http.StatusForbidden, "cross-origin"})
		kloudhttp.WriteError(w, http.StatusForbidden, "cross-origin terminal requests are refused")
		return
	}
	browser, err := websocket.Accept(w, r, &websocket.AcceptOptions{OriginPatterns: h.o.Browser.OriginPatterns(h.o.PublicURL)})
	if err != nil {
		h.log.DebugContext(r.Context(), "terminal: websocket accept", "err", err)
		return
	}
	browser.SetReadLimit(klientapi.MaxFrame)
	log := h.log.With("machine", m.ID, "user", user)

	var att attachment
	var res klientapi.ConnectResult
	agent, err := h.o.Agents.Agent(r.Context(), m)
	if err == nil {
		att, res, err = h.connect(r.Context(), agent, user, m, p)
	}
	if err != nil && agentLost(err) {
		att, res, err = h.waitAgent(r.Context(), browser, user, m, p, err)
	}
	klient := att.ws
	if err != nil {
		refused(err)
		log.Info("terminal refused", "err", err)
		var code websocket.StatusCode = klientapi.CloseRefused
		if agentLost(err) {
			code = klientapi.CloseAgentGone
		}
		browser.Close(code, closeReason(err))
		return
	}
	log.Info("terminal opened", "session", res.Session, "mode", res.Mode, "created", res.Created)
	h.attempt(r, ActionTerminalOpen, user, target, http.StatusOK)
	h.touch(m.ID) // attaching is activity
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
	rl.raw = att.raw
	defer h.track(r, func() { // revoke.go
		rl.cancel()
		rl.browser.Close(websocket.StatusPolicyViolation, RevokedReason)
		rl.klient.Close(websocket.StatusNormalClosure, "the user's credential was revoked")
	})()
	if res.Mode != klientapi.ModeReadonly {
		rl.onInput = func() { h.touch(m.ID) } // typing is activity
	}
	rl.run()
	log.Info("terminal closed", "session", res.Session, "reason", rl.reason)
	h.closedAudit(r, ActionTerminalClose, user, target, time.Since(opened), rl.bytes.Load())
}

// connect asks the machine's klient for an attachment and returns klient's WebSocket for it.
func (h *Hub) connect(ctx context.Context, agent Agent, user string, m *model.Machine, p klientapi.ConnectParams) (attachment, klientapi.ConnectResult, error) {
	var res klientapi.ConnectResult
	tok, err := h.userToken(user, m)
	if err != nil {
		return attachment{}, res, err
	}
	ticket, ch := h.newTicket()
	defer h.dropTicket(ticket)
	p.Token, p.Attach = tok, klientapi.Attach{URL: h.attachURL(m), Ticket: ticket}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := agent.Call(cctx, klientapi.MethodWebtermConnect, p, &res); err != nil {
		select {
		case a := <-ch: // klient dialed, then gave up
			a.ws.CloseNow()
		default:
		}
		return attachment{}, res, err
	}
	select {
	case a := <-ch:
		return a, res, nil
	case <-cctx.Done():
		return attachment{}, res, fmt.Errorf("klient attached session %s but its connection never arrived: %w", res.Session, kite.ErrTimeout)
	}
}

// agentLost says whether err is the machine's agent being away (not connected, its connection
// closed during the call, or klient's attachment never arriving), not klient's refusal: an error
// klient answered (a *kite.Error decoded from its reply, e.g. an account that cannot be had, "not
// allowed in this state") is its answer, and waiting for the agent would not change it.
func agentLost(err error) bool {
	var ke *kite.Error
	if errors.As(err, &ke) && ke != kite.ErrState && ke != kite.ErrTimeout {
		return false
	}
	return errors.Is(err, kite.ErrState) || errors.Is(err, kite.ErrClosed) || errors.Is(err, kite.ErrTimeout)
}

// waitAgent attaches once m's agent is back, for up to agentWait: the browser is told
// {"unreachable": why} first. It returns the last error (agentLost) when the agent did not
// come back in time or the request ended.
func (h *Hub) waitAgent(ctx context.Context, browser *websocket.Conn, user string, m *model.Machine, p klientapi.ConnectParams, why error) (attachment, klientapi.ConnectResult, error) {
	var res klientapi.ConnectResult
	notice, _ := json.Marshal(terminalNotice{Unreachable: "the machine is unreachable: " + why.Error()})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := browser.Write(wctx, websocket.MessageText, notice)
	cancel()
	if err != nil {
		return attachment{}, res, fmt.Errorf("the browser went away: %w", err)
	}
	deadline := time.Now().Add(agentWait)
	for time.Now().Before(deadline) {
		if !kite.Sleep(ctx, agentPoll) {
			return attachment{}, res, fmt.Errorf("waiting for the machine's agent: %w: %w", ctx.Err(), why)
		}
		agent, err := h.o.Agents.Agent(ctx, m)
		if err != nil {
			why = err
			continue
		}
		a, res, err := h.connect(ctx, agent, user, m, p)
		if err == nil || !agentLost(err) {
			return a, res, err
		}
		why = err
	}
	return attachment{}, res, fmt.Errorf("the machine is unreachable (waited %s for its agent): %w", agentWait, why)
}

// attachment is klient's WebSocket of one attachment, and the connection under it.
type attachment struct {
	ws  *websocket.Conn
	raw net.Conn // nil when unknown
	// peer is klient's request headers (a tunnel's read limit, tunnel.New).
	peer http.Header
}

// hijackRecorder keeps the connection websocket.Accept hijacks from the ResponseWriter.
type hijackRecorder struct {
	http.ResponseWriter
	conn net.Conn
}

func (w *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	w.conn = c
	return c, rw, err
}

// abortConn closes c with a TCP reset, discarding what is queued to it: input relayed into a
// cut link is not delivered when the link returns (the browser sends it again on its next
// attachment, since it was never confirmed).
func abortConn(c net.Conn) {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS
		c = nc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
		tc.Close()
	}
}

// ticketSep separates the waiting replica's id from the random part of a ticket.
const ticketSep = "~"

func (h *Hub) newTicket() (string, chan attachment) {
	t := rand.Text()
	if h.o.Replica != "" {
		t = h.o.Replica + ticketSep + t
	}
	ch := make(chan attachment, 1)
	h.mu.Lock()
	h.pending[t] = ch
	h.mu.Unlock()
	time.AfterFunc(ticketTTL, func() { h.dropTicket(t) })
	return t, ch
}

func (h *Hub) dropTicket(t string) {
	h.mu.Lock()
	delete(h.pending, t)
	h.mu.Unlock()
}

// ServeAttach is GET klientapi.AttachPath, klient's side of an attachment (a terminal's or a
// tunnel's): the ticket (one-time) names the request waiting for it. A ticket of another
// replica (its id before ticketSep) is proxied to that replica (proxyAttach).
func (h *Hub) ServeAttach(w http.ResponseWriter, r *http.Request) {
	t := r.URL.Query().Get("ticket")
	h.mu.Lock()
	ch := h.pending[t]
	delete(h.pending, t)
	h.mu.Unlock()
	if ch == nil && t != "" && h.proxyAttach(w, r, t) {
		return
	}
	if ch == nil || t == "" {
		kloudhttp.WriteError(w, http.StatusForbidden, "unknown, used or expired ticket")
		return
	}
	hw := &hijackRecorder{ResponseWriter: w}
	tunnel.Header(w.Header()) // a tunnel's klient sends kloud messages up to tunnel.ReadLimit
	ws, err := websocket.Accept(hw, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(klientapi.MaxFrame)                    // a terminal's; a tunnel's is tunnel.New's
	ch <- attachment{ws: ws, raw: hw.conn, peer: r.Header} // buffered; the waiter takes it or drops the ticket's channel
}

// termRelay copies frames between a browser and klient; each direction holds at most one
// frame, so a slow reader on either side pushes back to the writer (and, on klient's side, to
// the PTY).
type termRelay struct {
	h               *Hub
	browser, klient *websocket.Conn
	ctx             context.Context
	cancel          context.CancelFunc
	once            sync.Once
	reason          string
	bytes           atomic.Int64 // relayed both ways (message payloads)
	machine         string       // the machine's id
	onInput         func()       // called on each input frame from the browser (nil: none)

	input     atomic.Int64 // input bytes relayed to klient (opcode 0 frames, without it)
	confirmed int64        // input bytes klient is known to have (watchKlient's)
	// writing is set while a frame from klient is being written to the browser, and stalled
	// counts such writes that took longer than a second: klient's pongs are read by that copy,
	// so a ping unanswered while the browser held it back proves nothing about klient.
	writing atomic.Bool
	stalled atomic.Int64
	lost    atomic.Pointer[string] // why watchKlient gave klient's side up
	raw     net.Conn               // klient's connection under its WebSocket (nil: unknown)
	// pingEvery and pingWait are klientPingInterval and klientPingTimeout (tests shorten them).
	pingEvery, pingWait time.Duration
	// inputPing (cap 1) tells watchKlient of input: it pings once input paused (inputQuiet, at
	// most inputMaxWait), not at the next tick, so what a cut leaves unconfirmed (and the page
	// sends again) is only what was typed in the moment before it, not in the last 5 s.
	inputPing chan struct{}
}

func (h *Hub) start(browser, klient *websocket.Conn, machine string) *termRelay {
	ctx, cancel := context.WithCancel(context.Background())
	rl := &termRelay{h: h, browser: browser, klient: klient, ctx: ctx, cancel: cancel, machine: machine,
		pingEvery: klientPingInterval, pingWait: klientPingTimeout, inputPing: make(chan struct{}, 1)}
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
	// The copies read and write without a context of their own (coder/websocket registers a
	// timeout on every operation under a cancellable one: per frame, both ways); the relay's end
	// closes both connections, which ends them, as a cancelled operation would have.
	context.AfterFunc(ctx, func() {
		browser.CloseNow()
		klient.CloseNow()
	})
	return rl
}

// count adds n to c (nil: nothing).
func count(c prometheus.Counter, n int) {
	if c != nil {
		c.Add(float64(n))
	}
}

// run relays until either side ends, then closes the other with the same code and reason.
func (rl *termRelay) run() {
	defer func() {
		rl.h.mu.Lock()
		delete(rl.h.relays, rl)
		rl.h.mu.Unlock()
		rl.cancel()
	}()
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		out := rl.h.o.Metrics.TerminalBytesOut
		err := copyFrames(rl.browser, rl.klient, false, nil, func(n int) { rl.bytes.Add(int64(n)); count(out, n) }, rl.writeWatch)
		code, reason := websocket.CloseStatus(err), closeText(err)
		if code == -1 || code == websocket.StatusAbnormalClosure {
			code, reason = klientapi.CloseAgentGone, "lost the connection to the machine's agent"
		}
		if lost := rl.lost.Load(); lost != nil {
			code, reason = klientapi.CloseAgentGone, *lost
		}
		rl.end(rl.browser, code, reason)
		rl.klient.CloseNow()
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		in := rl.h.o.Metrics.TerminalBytesIn
		input := func(n int) {
			rl.input.Add(int64(n))
			select {
			case rl.inputPing <- struct{}{}:
			default: // one is pending already
			}
			if rl.onInput != nil {
				rl.onInput()
			}
		}
		err := copyFrames(rl.klient, rl.browser, true, input, func(n int) { rl.bytes.Add(int64(n)); count(in, n) }, nil)
		var code websocket.StatusCode = websocket.StatusNormalClosure
		reason := "the browser went away"
		if ce := websocket.CloseStatus(err); ce == klientapi.CloseBadMessage || ce == websocket.StatusUnsupportedData || ce == websocket.StatusMessageTooBig {
			code, reason = ce, closeText(err)
		}
		rl.end(rl.klient, code, reason)
	}()
	go rl.keepalive()
	go rl.watchKlient()
	<-done
	<-done
}

// end closes c with code and reason (once per relay: the first side to end decides).
func (rl *termRelay) end(c *websocket.Conn, code websocket.StatusCode, reason string) {
	rl.once.Do(func() { rl.reason = fmt.Sprintf("%d %s", code, reason) })
	c.Close(code, truncateUTF8(reason, 123))
}

func (rl *termRelay) keepalive() {
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

// writeWatch wraps one write of a frame from klient to the browser (see termRelay.writing).
func (rl *termRelay) writeWatch(write func() error) error {
	rl.writing.Store(true)
	start := time.Now()
	err := write()
	if time.Since(start) > time.Second {
		rl.stalled.Add(1)
	}
	rl.writing.Store(false)
	return err
}

// watchKlient pings klient's side every klientPingInterval, and after input (once it paused
// for inputQuiet, at most inputMaxWait after it began), until the relay ends. An answered ping
// confirms the input relayed before it (the browser is told {"confirmed": n}: WebSocket frames
// arrive in order, so klient read those before it answered).
// An unanswered one ends the relay: the browser gets 4004 "the machine is unreachable", and
// sends what was not confirmed again once it is attached anew. (keepalive pings the browser's
// side, only to keep proxies from closing an idle terminal.)
func (rl *termRelay) watchKlient() {
	t := time.NewTicker(rl.pingEvery)
	defer t.Stop()
	quiet := time.NewTimer(inputQuiet)
	defer quiet.Stop()
	for {
		select {
		case <-rl.ctx.Done():
			return
		case <-t.C:
		case <-rl.inputPing:
			// Wait for input to pause (inputQuiet), at most inputMaxWait.
			first := time.Now()
		wait:
			for {
				quiet.Reset(inputQuiet)
				select {
				case <-rl.ctx.Done():
					return
				case <-rl.inputPing:
					if time.Since(first) < inputMaxWait {
						continue
					}
				case <-quiet.C:
				}
				break wait
			}
		}
		sent, stalls := rl.input.Load(), rl.stalled.Load()
		ctx, cancel := context.WithTimeout(rl.ctx, rl.pingWait)
		err := rl.klient.Ping(ctx)
		cancel()
		if rl.ctx.Err() != nil {
			return
		}
		if err != nil {
			if rl.writing.Load() || rl.stalled.Load() != stalls {
				continue // the browser held the copy that reads klient's pong back: try again
			}
			reason := fmt.Sprintf("the machine is unreachable: its agent did not answer for %s", rl.pingWait)
			rl.h.log.Info("terminal: klient's side does not answer", "machine", rl.machine, "err", err,
				"unconfirmedInput", rl.input.Load()-rl.confirmed)
			rl.lost.Store(&reason) // the copy from klient ends with it
			if rl.raw != nil {
				abortConn(rl.raw)
			}
			rl.klient.CloseNow()
			return
		}
		if sent > rl.confirmed {
			rl.confirmed = sent
			notice, _ := json.Marshal(terminalNotice{Confirmed: sent})
			wctx, cancel := context.WithTimeout(rl.ctx, rl.pingWait)
			rl.browser.Write(wctx, websocket.MessageText, notice) // a failed write: the browser side ends the relay
			cancel()
		}
	}
}

// copyFrames copies messages from src to dst until src ends, with one frame's buffer, telling
// relayed the size of each frame it relayed (the audit entry's bytes, the metrics' counters).
// fromBrowser frames must be binary with an opcode byte (the rest klient checks); onInput, if
// set, is told the size of each input frame's bytes (opcode 0) once written. watch, if set,
// wraps each write to dst. It reads and writes under no context (see Hub.start: the relay's end
// closes both connections).
func copyFrames(dst, src *websocket.Conn, fromBrowser bool, onInput func(n int), relayed func(n int), watch func(write func() error) error) error {
	ctx := context.Background()
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
		write := func() error { return dst.Write(ctx, typ, buf[:n]) }
		if watch != nil {
			if err := watch(write); err != nil {
				return err
			}
		} else if err := write(); err != nil {
			return err
		}
		if fromBrowser && onInput != nil && buf[0] == 0 {
			onInput(n - 1)
		}
		relayed(n)
	}
}

// Sessions is how many terminals are relayed now (kloud's terminal_sessions gauge).
func (h *Hub) Sessions() int {
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

// Notice writes text to the terminals attached to machine id through this hub, as output (the
// idle stop's warning); it returns how many it reached.
func (h *Hub) Notice(id, text string) int {
	h.mu.Lock()
	var rs []*termRelay
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
func (h *Hub) closeAll() {
	h.mu.Lock()
	h.closed = true
	rs := make([]*termRelay, 0, len(h.relays))
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

// agentCall calls a webterm method on the machine's klient for user.
func (h *Hub) agentCall(ctx context.Context, user string, m *model.Machine, method string, params func(token string) any, res any) error {
	agent, err := h.o.Agents.Agent(ctx, m)
	if err != nil {
		return err
	}
	tok, err := h.userToken(user, m)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return agent.Call(ctx, method, params(tok), res)
}

// ServeSessions is GET /api/machines/{id}/sessions: the machine's terminal sessions.
func (h *Hub) ServeSessions(w http.ResponseWriter, r *http.Request) {
	user, m, err := h.target(r, mayTerminal)
	if err != nil {
		writeErr(w, err)
		return
	}
	var res klientapi.ListResult
	if err := h.agentCall(r.Context(), user, m, klientapi.MethodWebtermList, func(tok string) any { return klientapi.TokenParams{Token: tok} }, &res); err != nil {
		writeErr(w, err)
		return
	}
	kloudhttp.WriteJSON(w, http.StatusOK, res)
}

// ServeKill is DELETE /api/machines/{id}/sessions/{session}.
func (h *Hub) ServeKill(w http.ResponseWriter, r *http.Request) {
	user, m, err := h.target(r, mayTerminal)
	if err == nil {
		sess := r.PathValue("session")
		if err = h.agentCall(r.Context(), user, m, klientapi.MethodWebtermKill, func(tok string) any { return klientapi.SessionParams{Session: sess, Token: tok} }, nil); err == nil {
			kloudhttp.WriteJSON(w, http.StatusOK, map[string]string{"session": sess})
		}
	}
	if user != "" {
		h.attempt(r, ActionTerminalKill, user, "machine/"+r.PathValue("id"), Status(err))
	}
	if err != nil {
		writeErr(w, err)
	}
}

// ServeRename is POST /api/machines/{id}/sessions/{session}/rename {name}.
func (h *Hub) ServeRename(w http.ResponseWriter, r *http.Request) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		kloudhttp.WriteError(w, http.StatusUnsupportedMediaType, `send {"name": "..."} as application/json`)
		return
	}
	user, m, err := h.target(r, mayTerminal)
	if err != nil {
		writeErr(w, err)
		return
	}
	var body struct {
		Name string `json:"name"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Name == "" {
		kloudhttp.WriteError(w, http.StatusBadRequest, `body must be {"name": "..."}`)
		return
	}
	sess := r.PathValue("session")
	var info klientapi.SessionInfo
	err = h.agentCall(r.Context(), user, m, klientapi.MethodWebtermRename, func(tok string) any {
		return klientapi.RenameParams{Session: sess, Name: body.Name, Token: tok}
	}, &info)
	h.attempt(r, ActionTerminalRename, user, "machine/"+m.ID, Status(err))
	if err != nil {
		writeErr(w, err)
		return
	}
	kloudhttp.WriteJSON(w, http.StatusOK, info)
}
