package cli

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
)

// kloud ssh MACHINE: the local terminal attached to a web terminal session on the machine,
// through kloud's terminal endpoint (the browser's path), so it works for every machine with a
// connected agent and no port open on it.

// Detach sequence: Ctrl-] then '.'. Ctrl-] twice sends one Ctrl-].
const (
	escapeByte = 0x1d
	detachByte = '.'
)

func sshCmd(g *globals) *cobra.Command {
	var session, mode string
	var stdio bool
	cmd := &cobra.Command{
		Use:     "ssh MACHINE",
		Aliases: []string{"term"},
		Short:   "Attach this terminal to a shell on a machine (a web terminal session, through kloud)",
		Long: `Attach this terminal to a login shell on MACHINE (its id or label), through kloud: the
same sessions as the browser's terminal tabs. The session outlives the connection: detach with
Ctrl-] then '.', and come back with --session. Without --session a new session is started.

Modes: create (new session), attach (that session, or a new one with that id), shared (join an
existing session), readonly (watch it). A read-only share may only watch.

With --stdio, MACHINE may also be kloud--<label or id> (the Host names of ` + "`kloud config-ssh`" + `):
an SSH connection to the machine's agent is carried over stdin and stdout, for OpenSSH's
ProxyCommand (sshstdio.go). Errors go to stderr, with a non-zero exit.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if stdio {
				return g.sshStdio(cmd.Context(), args[0])
			}
			return g.ssh(cmd.Context(), args[0], session, mode)
		},
	}
	cmd.Flags().BoolVar(&stdio, "stdio", false, "carry an SSH connection to the machine over stdin/stdout (OpenSSH's ProxyCommand; see config-ssh)")
	cmd.Flags().StringVar(&session, "session", "", "session id to attach to (or to start, with --mode attach)")
	cmd.Flags().StringVar(&mode, "mode", "", "create, attach, shared or readonly (default: attach with --session, else create)")
	return cmd
}

// credential returns the raw kite key or session that --key names (as dial reads it).
func (g *globals) credential() (string, error) {
	p := g.key
	if p == "" {
		p = filepath.Join(g.dataDir, kloud.AdminKeyFile)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read key %s: %w\n  pass --key FILE (or KLOUD_KEY), or log in with `kloud login`", p, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// findMachine resolves an id or a label among the caller's machines.
func (g *globals) findMachine(ctx context.Context, name string) (*model.Machine, error) {
	c, err := g.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close(nil)
	res, err := api.NewClient(c).MachineList(ctx, api.MachineListParams{})
	if err != nil {
		return nil, explain(err)
	}
	var byLabel []model.Machine
	for _, m := range res.Machines {
		if m.ID == name {
			return &m, nil
		}
		if m.Label == name {
			byLabel = append(byLabel, m)
		}
	}
	switch len(byLabel) {
	case 0:
		return nil, fmt.Errorf("no machine %q among yours: see `kloud machine list`", name)
	case 1:
		return &byLabel[0], nil
	}
	ids := make([]string, 0, len(byLabel))
	for _, m := range byLabel {
		ids = append(ids, m.ID+" (stack "+m.StackID+")")
	}
	return nil, fmt.Errorf("%d machines are labelled %q; name one by id: %s", len(byLabel), name, strings.Join(ids, ", "))
}

func (g *globals) ssh(ctx context.Context, name, session, mode string) error {
	cred, err := g.credential()
	if err != nil {
		return err
	}
	m, err := g.findMachine(ctx, name)
	if err != nil {
		return err
	}
	hc, err := g.httpClient()
	if err != nil {
		return err
	}
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	interactive := term.IsTerminal(in)
	if session == "" && (mode == "" || mode == klientapi.ModeCreate) {
		session = strings.ToLower(rand.Text()[:12])
		mode = klientapi.ModeCreate
	}
	t := &sshTerm{g: g, hc: hc, cred: cred, m: m, session: session, mode: mode, out: out}
	ws, err := t.dial(ctx)
	if err != nil {
		return err
	}
	nl := "\n"
	if interactive {
		old, err := term.MakeRaw(in)
		if err != nil {
			ws.CloseNow()
			return fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(in, old)
		nl = "\r\n"
	}
	fmt.Fprintf(g.stderr, "[kloud: %s session %s; detach with Ctrl-] then '.'; come back with --session %s]%s", m.Label, session, session, nl)

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	// One reader of stdin for every connection: what is typed while a connection is being
	// made again waits (a bounded queue) and is sent on the next one.
	detached := make(chan struct{})
	input := make(chan []byte, 64)
	go sshInput(ctx, input, detached)
	deadline := time.Time{} // of reattaching, while it lasts
	announce := ""          // said once the session answers again
	ever := false           // the session answered once: a lost connection is attached again
	for attempt := 0; ; attempt++ {
		if ws == nil {
			if ws, err = t.dial(ctx); err != nil {
				if time.Now().After(deadline) || ctx.Err() != nil {
					return fmt.Errorf("%s%w", nl, err)
				}
				if !kite.Sleep(ctx, reattachDelay(attempt)) {
					return ctx.Err()
				}
				continue
			}
		}
		end, answered, err := t.serve(ctx, ws, input, detached, announce)
		ws.CloseNow()
		ws = nil
		if answered {
			attempt, deadline, announce, ever = 0, time.Time{}, "", true
		}
		switch end {
		case sshDetached:
			fmt.Fprintf(g.stderr, "%s[kloud: detached from session %s; reattach: kloud ssh %s --session %s]%s", nl, session, name, session, nl)
			return nil
		case sshDone:
			if err != nil {
				return fmt.Errorf("%s%w", nl, err)
			}
			return nil
		}
		if !ever { // never attached: say why at once (an agent that is not connected)
			return fmt.Errorf("%s%w", nl, err)
		}
		// sshAgain: the machine's agent restarted (an upgrade) or the link to kloud broke;
		// the session lives on (in its holder): attach to it again, for a while.
		if deadline.IsZero() {
			deadline = time.Now().Add(reattachFor)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s%w", nl, err)
		}
		if answered { // said once per loss, not per attempt
			fmt.Fprintf(g.stderr, "%s[kloud: %v; reattaching to session %s…]%s", nl, err, session, nl)
			announce = fmt.Sprintf("%s[kloud: reattached to session %s]%s", nl, session, nl)
			if interactive {
				announce += "\x1b[H\x1b[2J" // the replay repaints the screen
			}
		}
		t.mode = klientapi.ModeShared // the session as it is, never a new one
		if mode == klientapi.ModeReadonly {
			t.mode = klientapi.ModeReadonly
		}
		if !kite.Sleep(ctx, reattachDelay(attempt)) {
			return ctx.Err()
		}
	}
}

// reattachFor bounds how long kloud ssh tries to attach again to a session whose connection was
// lost (a klient restart takes a few seconds; kloud's own restart a few more).
const reattachFor = time.Minute

// reattachDelay is the wait before attempt n (0, 1, …) of attaching again: 0.25 s doubling to 4 s.
func reattachDelay(n int) time.Duration {
	return min(250*time.Millisecond<<min(n, 4), 4*time.Second)
}

// sshTerm is one `kloud ssh` attachment: what it dials, again after a lost connection.
type sshTerm struct {
	g             *globals
	hc            *http.Client
	cred          string
	m             *model.Machine
	session, mode string
	out           int // the output's fd, for the terminal's size
}

// dial opens the terminal WebSocket (kloud's terminal endpoint, the browser's path).
func (t *sshTerm) dial(ctx context.Context) (*websocket.Conn, error) {
	cols, rows := 80, 24
	if w, h, err := term.GetSize(t.out); err == nil && w > 0 && h > 0 {
		cols, rows = w, h
	}
	q := url.Values{"session": {t.session}, "cols": {fmt.Sprint(cols)}, "rows": {fmt.Sprint(rows)}}
	if t.mode != "" {
		q.Set("mode", t.mode)
	}
	u := strings.TrimRight(t.g.url, "/") + "/api/machines/" + url.PathEscape(t.m.ID) + "/terminal?" + q.Encode()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ws, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: t.hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + t.cred}}})
	cancel()
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var e struct{ Error string }
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			if json.Unmarshal(b, &e) != nil || e.Error == "" {
				e.Error = strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("open a terminal on %s: %s: %s", t.m.Label, resp.Status, e.Error)
		}
		return nil, fmt.Errorf("open a terminal on %s: cannot reach kloud at %s: %w", t.m.Label, t.g.url, err)
	}
	ws.SetReadLimit(klientapi.MaxFrame)
	return ws, nil
}

// How one connection of `kloud ssh` ended.
const (
	sshDone     = iota // the session ended, or was refused: err says why (nil: it ended well)
	sshDetached        // the user detached (Ctrl-] .)
	sshAgain           // the connection was lost with the session alive: attach again (err: why)
)

// serve carries one connection: input to it, its output to stdout, until it ends. It reports
// whether the session answered (output came), after writing announce before its first output.
func (t *sshTerm) serve(ctx context.Context, ws *websocket.Conn, input <-chan []byte, detached <-chan struct{}, announce string) (end int, answered bool, err error) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case f := <-input:
				if err := ws.Write(ctx, websocket.MessageBinary, f); err != nil {
					return // the frame is lost with the connection; the read below says why
				}
			}
		}
	}()
	if term.IsTerminal(t.out) {
		go sshResize(ctx, ws, t.out)
	}
	var got atomic.Bool
	errc := make(chan error, 1)
	go func() {
		for {
			typ, b, err := ws.Read(ctx)
			if err != nil {
				errc <- err
				return
			}
			if typ == websocket.MessageText {
				continue // kloud's notice of what we attached to
			}
			if !got.Swap(true) && announce != "" {
				fmt.Fprint(t.g.stderr, announce)
			}
			if _, err := os.Stdout.Write(b); err != nil {
				errc <- err
				return
			}
		}
	}()
	defer func() { answered = got.Load() }()
	select {
	case <-detached:
		ws.Close(websocket.StatusNormalClosure, "detached")
		return sshDetached, false, nil
	case <-ctx.Done():
		ws.Close(websocket.StatusGoingAway, "interrupted")
		return sshDone, false, ctx.Err()
	case err := <-errc:
		code := websocket.CloseStatus(err)
		var ce websocket.CloseError
		errors.As(err, &ce)
		switch code {
		case klientapi.CloseEnded, websocket.StatusNormalClosure:
			fmt.Fprintf(t.g.stderr, "\r\n[kloud: %s]\r\n", ce.Reason)
			return sshDone, false, nil
		case websocket.StatusGoingAway, klientapi.CloseAgentGone:
			return sshAgain, false, errors.New(ce.Reason)
		case -1:
			return sshAgain, false, fmt.Errorf("connection to kloud lost: %w", err)
		}
		return sshDone, false, fmt.Errorf("%s (%d)", ce.Reason, code)
	}
}

// sshInput reads stdin into input frames and watches for the detach sequence.
func sshInput(ctx context.Context, input chan<- []byte, detached chan<- struct{}) {
	buf := make([]byte, 32<<10)
	escaped := false
	for {
		n, err := os.Stdin.Read(buf)
		if err != nil {
			return // EOF (not a terminal): keep showing output until the session ends
		}
		frame := make([]byte, 0, n+2)
		frame = append(frame, klientapi.OpInput)
		for _, c := range buf[:n] {
			switch {
			case escaped && c == detachByte:
				close(detached)
				return
			case escaped && c == escapeByte:
				frame = append(frame, escapeByte)
				escaped = false
			case escaped:
				frame = append(frame, escapeByte, c)
				escaped = false
			case c == escapeByte:
				escaped = true
			default:
				frame = append(frame, c)
			}
		}
		if len(frame) > 1 {
			select {
			case input <- frame:
			case <-ctx.Done():
				return
			}
		}
	}
}

// sshResize sends the terminal's size whenever it changes (SIGWINCH).
func sshResize(ctx context.Context, ws *websocket.Conn, fd int) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	defer signal.Stop(ch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			w, h, err := term.GetSize(fd)
			if err != nil || w <= 0 || h <= 0 {
				continue
			}
			b, _ := json.Marshal(klientapi.Size{Cols: w, Rows: h})
			if err := ws.Write(ctx, websocket.MessageBinary, append([]byte{klientapi.OpResize}, b...)); err != nil {
				return
			}
		}
	}
}
