package webterm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/klient/klientapi"
)

// Dial opens klient's side of an attachment: a WebSocket to a.URL with the ticket. hc, if not
// nil, makes the request (klient's, trusting kloud's CA); nil: net/http's default client.
func Dial(ctx context.Context, a Attach, kontrolURL string, hc *http.Client) (*websocket.Conn, error) {
	ws, _, err := DialHeader(ctx, a, kontrolURL, hc, nil)
	return ws, err
}

// DialHeader is Dial with headers h on the request; it also returns the 101 answer's headers
// (a tunnel's read limit, see internal/tunnel).
func DialHeader(ctx context.Context, a Attach, kontrolURL string, hc *http.Client, h http.Header) (*websocket.Conn, http.Header, error) {
	u, err := klientapi.CheckAttachURL(a.URL, kontrolURL)
	if err != nil {
		return nil, nil, err
	}
	q := u.Query()
	q.Set("ticket", a.Ticket)
	u.RawQuery = q.Encode()
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPClient: hc, HTTPHeader: h})
	if err != nil {
		if resp != nil {
			return nil, nil, fmt.Errorf("dial %s%s: %s: %w", u.Host, u.Path, resp.Status, err)
		}
		return nil, nil, fmt.Errorf("dial %s%s: %w", u.Host, u.Path, err)
	}
	ws.SetReadLimit(MaxFrame)
	return ws, resp.Header, nil
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
