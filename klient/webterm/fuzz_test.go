package webterm_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
)

// FuzzWire sends one hostile frame from the browser's side of the terminal wire (Serve: the
// frames kloud's relay passes on to klient), then types a command. Input frames are the user's
// keystrokes (what they type is theirs), so the fuzzer sends every other frame: resizes with any
// JSON, unknown opcodes, empty and text frames. A frame the wire refuses (text or empty) closes
// the connection with CloseBadMessage, as documented; any other leaves the connection and the
// session working: the typed command's output arrives. The session is shared by every input, so
// a frame that broke it fails the inputs after it too.
func FuzzWire(f *testing.F) {
	testutil.RequireBinary(f, "bash")
	mach := webtermtest.New(f, "alice")
	m, err := webterm.New(webterm.Options{Owner: "alice", Root: mach.Root, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(m.Close)
	v0, _, err := m.Open(webterm.OpenRequest{Session: "fz", User: "alice", Mode: webterm.ModeCreate, Cols: 80, Rows: 24})
	if err != nil {
		f.Fatal(err)
	}
	v0.Close() // the session lives on without viewers
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		v, _, err := m.Open(webterm.OpenRequest{Session: "fz", User: "alice", Mode: webterm.ModeShared, AnyAccount: true, Cols: 80, Rows: 24})
		if err != nil {
			ws.Close(websocket.StatusCode(webterm.CloseRefused), err.Error())
			return
		}
		webterm.Serve(r.Context(), ws, v, webterm.ServeOptions{})
	}))
	f.Cleanup(srv.Close)
	for _, s := range []string{
		"\x01{\"cols\":100,\"rows\":30}", "\x01{\"cols\":0,\"rows\":0}", "\x01{\"cols\":-1,\"rows\":1e9}",
		"\x01{\"cols\":100000,\"rows\":100000}", "\x01null", "\x01", "\x01[", "\x02hello", "\xff", "",
		"\x01{\"cols\":1.5,\"rows\":\"24\"}", "\x01{\"cols\":80,\"rows\":24,\"x\":{}}",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, frame []byte, text bool) {
		if !text && len(frame) > 0 && frame[0] == webterm.OpInput {
			t.Skip("input frames are keystrokes")
		}
		ctx, cancel := context.WithTimeout(t.Context(), webtermtest.Wait)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		term := webtermtest.NewTerm(ws)
		typ := websocket.MessageBinary
		if text {
			typ = websocket.MessageText
		}
		if err := ws.Write(ctx, typ, frame); err != nil {
			t.Fatalf("write the frame: %v", err)
		}
		if text || len(frame) == 0 {
			if ce := term.Closed(t); int(ce.Code) != webterm.CloseBadMessage {
				t.Fatalf("frame %q (text %v): closed with %v, want %d", frame, text, ce, webterm.CloseBadMessage)
			}
			return
		}
		mark := n.Add(1)
		term.Type(t, fmt.Sprintf("echo fz-$((%d*2))\n", mark))
		term.WaitFor(t, fmt.Sprintf("fz-%d", mark*2))
	})
}
