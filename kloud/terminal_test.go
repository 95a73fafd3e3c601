package kloud_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// termEnv is a built stack with one machine (a real klient process of the dummy provider)
// whose owner alice has a login shell.
type termEnv struct {
	*flowEnv
	machine model.Machine
}

func newTermEnv(t *testing.T) *termEnv {
	t.Helper()
	return newTermEnvWith(t, kloudtest.Options{})
}

// newTermEnvWith is newTermEnv with kloud's options.
func newTermEnvWith(t *testing.T, ko kloudtest.Options) *termEnv {
	t.Helper()
	testutil.RequireBinary(t, "bash")
	f := newFlowWith(t, dummy.Options{}, ko)
	f.credential()
	sid, _ := f.stack(f.template(`
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho up"
}
`))
	if last := f.follow(f.apply(sid, false)); last.Status != "succeeded" {
		t.Fatalf("build: %+v", last)
	}
	m := f.machines(sid)["vm"]
	// The dummy machine is a directory of this host: give it an account for its owner.
	webtermtest.At(t, filepath.Join(f.dir, sid, "vm"), "alice")
	if _, err := f.client().UserSetPassword(t.Context(), api.SetPasswordParams{Password: "alice-password"}); err != nil {
		t.Fatal(err)
	}
	return &termEnv{flowEnv: f, machine: m}
}

// login logs in over HTTP as a browser does and returns the session cookie's value.
func (e *termEnv) login(user, password string) string {
	e.t.Helper()
	body, _ := json.Marshal(map[string]string{"username": user, "password": password})
	resp, err := http.Post(e.URL+"/api/login", "application/json", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == kloud.SessionCookie {
			return c.Value
		}
	}
	b, _ := io.ReadAll(resp.Body)
	e.t.Fatalf("login %s: %s %s", user, resp.Status, b)
	return ""
}

// open opens the terminal endpoint as a browser on kloud's origin with the session cookie.
func (e *termEnv) open(cookie, query string) (*webtermtest.Term, *http.Response, error) {
	return e.dial(cookie, e.machine.ID, query, e.URL)
}

func (e *termEnv) dial(cookie, machineID, query, origin string) (*webtermtest.Term, *http.Response, error) {
	h := http.Header{}
	if cookie != "" {
		h.Set("Cookie", kloud.SessionCookie+"="+cookie)
	}
	if origin != "" {
		h.Set("Origin", origin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, e.URL+"/api/machines/"+machineID+"/terminal?"+query, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, resp, err
	}
	e.t.Cleanup(func() { ws.CloseNow() })
	return webtermtest.NewTerm(ws), resp, nil
}

func (e *termEnv) mustOpen(cookie, query string) *webtermtest.Term {
	e.t.Helper()
	term, resp, err := e.open(cookie, query)
	if err != nil {
		e.t.Fatalf("open terminal %q: %v (%s)", query, err, status(resp))
	}
	return term
}

func status(resp *http.Response) string {
	if resp == nil {
		return "no response"
	}
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%s %s", resp.Status, strings.TrimSpace(string(b)))
}

func (e *termEnv) sessions(cookie string) []webterm.Info {
	e.t.Helper()
	req, _ := http.NewRequest("GET", e.URL+"/api/machines/"+e.machine.ID+"/sessions", nil)
	req.Header.Set("Cookie", kloud.SessionCookie+"="+cookie)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var res webterm.ListResult
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&res) != nil {
		e.t.Fatalf("sessions: %s", status(resp))
	}
	return res.Sessions
}

// TestTerminalThroughKloud is the browser's path: log in, open the machine's terminal through
// kloud, type, read; go away and come back to the same session and see it replayed.
func TestTerminalThroughKloud(t *testing.T) {
	t.Parallel()
	e := newTermEnv(t)
	cookie := e.login("alice", "alice-password")

	term := e.mustOpen(cookie, "session=tab-1&cols=100&rows=30")
	term.Type(t, "echo hello-$((6*7))\r")
	term.WaitFor(t, "hello-42")
	if n := term.Notices(); len(n) != 1 || n[0] != `{"session":"tab-1","mode":"create","created":true}` {
		t.Fatalf("notices: %q", n)
	}
	term.Resize(t, 120, 40)
	term.Type(t, "stty size\r")
	term.WaitFor(t, "40 120")
	ss := e.sessions(cookie)
	if len(ss) != 1 || ss[0].Session != "tab-1" || ss[0].CreatedBy != "alice" || len(ss[0].Viewers) != 1 {
		t.Fatalf("sessions: %+v", ss)
	}

	// The tab closes; the shell lives on; a new tab reattaches and gets the replay.
	term.WS.Close(websocket.StatusNormalClosure, "")
	testutil.Eventually(t, 20*time.Second, func() bool { s := e.sessions(cookie); return len(s) == 1 && len(s[0].Viewers) == 0 }, "viewer not detached")
	again := e.mustOpen(cookie, "session=tab-1&cols=120&rows=40")
	again.WaitFor(t, "hello-42")
	if n := again.Notices(); len(n) != 1 || n[0] != `{"session":"tab-1","mode":"attach","created":false}` {
		t.Fatalf("notices: %q", n)
	}
	again.Type(t, "echo back-$((5*5))\r")
	again.WaitFor(t, "back-25")

	// Rename and kill over HTTP; the open tab hears why it ended.
	req, _ := http.NewRequest("POST", e.URL+"/api/machines/"+e.machine.ID+"/sessions/tab-1/rename", strings.NewReader(`{"name":"logs"}`))
	req.Header.Set("Cookie", kloud.SessionCookie+"="+cookie)
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("rename: %v %s", err, status(resp))
	}
	if s := e.sessions(cookie); s[0].Name != "logs" {
		t.Fatalf("after rename: %+v", s)
	}
	req, _ = http.NewRequest("DELETE", e.URL+"/api/machines/"+e.machine.ID+"/sessions/tab-1", nil)
	req.Header.Set("Cookie", kloud.SessionCookie+"="+cookie)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("kill: %v %s", err, status(resp))
	}
	if c := again.Closed(t); c.Code != webterm.CloseEnded || !strings.Contains(c.Reason, "killed by alice") {
		t.Fatalf("after kill: %+v", c)
	}
}

func TestTerminalAccess(t *testing.T) {
	t.Parallel()
	e := newTermEnv(t)
	cookie := e.login("alice", "alice-password")
	addUsers(t, e.Env, true, "bob", "carol")
	bobCookie, carolCookie := e.login("bob", "bob-password"), e.login("carol", "carol-password")

	// Not logged in; another user's machine; a foreign origin; bad parameters.
	for _, c := range []struct {
		cookie, query, origin string
		want                  int
	}{
		{"", "", e.URL, http.StatusUnauthorized},
		{"not-a-jwt", "", e.URL, http.StatusUnauthorized},
		{carolCookie, "", e.URL, http.StatusNotFound},
		{cookie, "", "http://evil.example", http.StatusForbidden},
		{cookie, "cols=0", e.URL, http.StatusBadRequest},
		{cookie, "mode=shared", e.URL, http.StatusBadRequest},
	} {
		_, resp, err := e.dial(c.cookie, e.machine.ID, c.query, c.origin)
		if err == nil || resp == nil || resp.StatusCode != c.want {
			t.Errorf("cookie %.10q query %q origin %q: %v (%s), want %d", c.cookie, c.query, c.origin, err, status(resp), c.want)
		}
	}

	// Share the machine read-only with bob (what kloud's sharing does: the machine document,
	// and klient's list).
	ctx := t.Context()
	storetest.SetFields(t, e.Server.Store(), store.CollMachines, e.machine.ID, map[string]any{"shares": []model.Share{{Username: "bob", Grant: model.GrantReadonly}}})
	ownerToken, err := e.Server.Signer().Token("alice", e.machine.KiteID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	agent := e.Server.Kontrol.Conn(e.machine.KiteID)
	if err := agent.Call(ctx, "klient.share", klient.ShareParams{Username: "bob", Grant: klient.GrantReadonly, Token: ownerToken}, nil); err != nil {
		t.Fatal(err)
	}

	owner := e.mustOpen(cookie, "session=pair")
	owner.Type(t, "echo first-$((1+2))\r")
	owner.WaitFor(t, "first-3")                  // the session exists (the upgrade comes before webterm.connect)
	bob := e.mustOpen(bobCookie, "session=pair") // a read-only share defaults to mode=readonly
	bob.WaitFor(t, "first-3")                    // replayed
	bob.Type(t, "echo bob-$((1+1))\r")
	owner.Type(t, "echo owner-$((3+4))\r")
	owner.WaitFor(t, "owner-7")
	bob.WaitFor(t, "owner-7")
	if strings.Contains(owner.Output(), "bob-2") {
		t.Fatal("read-only viewer's input ran")
	}
	if _, resp, err := e.open(bobCookie, "session=pair&mode=shared"); err == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("read-only share asking to type: %v (%s)", err, status(resp))
	}
	// A readonly attach to a session that does not exist is refused by klient after the
	// upgrade, with the reason.
	if c := e.mustOpen(bobCookie, "session=nope").Closed(t); c.Code != webterm.CloseRefused || !strings.Contains(c.Reason, "nope") {
		t.Fatalf("missing session: %+v", c)
	}
	// klient unshares: bob's terminal closes at once, with the reason relayed by kloud.
	if err := agent.Call(ctx, "klient.unshare", klient.UnshareParams{Username: "bob", Token: ownerToken}, nil); err != nil {
		t.Fatal(err)
	}
	if c := bob.Closed(t); c.Code != webterm.CloseUnshared {
		t.Fatalf("bob after unshare: %+v", c)
	}
	owner.Type(t, "echo still-$((2*5))\r")
	owner.WaitFor(t, "still-10")
	// kloud's document still says bob may watch, klient says no: klient wins.
	if c := e.mustOpen(bobCookie, "session=pair").Closed(t); c.Code != webterm.CloseRefused || !strings.Contains(c.Reason, "not shared") {
		t.Fatalf("bob after unshare: %+v", c)
	}

	// The CLI's credential: a kite key as a bearer; machine agents' keys are refused.
	key, _, err := e.Server.Kontrol.CreateKey("alice", "")
	if err != nil {
		t.Fatal(err)
	}
	agentKey, _, err := e.Server.Kontrol.CreateKey("alice", kloud.AgentKitePrefix+"x")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		want int
	}{{key, http.StatusSwitchingProtocols}, {agentKey, http.StatusForbidden}} {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ws, resp, err := websocket.Dial(ctx, e.URL+"/api/machines/"+e.machine.ID+"/terminal?session=pair",
			&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + c.key}}})
		cancel()
		if resp == nil || resp.StatusCode != c.want {
			t.Fatalf("bearer kite key: %v (%s), want %d", err, status(resp), c.want)
		}
		if ws != nil {
			term := webtermtest.NewTerm(ws)
			term.WaitFor(t, "still-10")
			ws.Close(websocket.StatusNormalClosure, "")
		}
	}
}

// TestKloudSSH drives `kloud ssh` in a real terminal: it attaches to the session the browser
// started, types, and detaches with Ctrl-] . leaving the session running.
func TestKloudSSH(t *testing.T) {
	t.Parallel()
	e := newTermEnv(t)
	cookie := e.login("alice", "alice-password")
	term := e.mustOpen(cookie, "session=shared-tab")
	term.Type(t, "echo from-browser-$((2*21))\r")
	term.WaitFor(t, "from-browser-42")

	keyFile := filepath.Join(t.TempDir(), "session")
	if err := os.WriteFile(keyFile, []byte(cookie), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := testutil.BuildBinary(t, "./cmd/kloud")
	cmd := exec.Command(bin, "ssh", "vm", "--session", "shared-tab")
	cmd.Env = append(os.Environ(), "KLOUD_URL="+e.URL, "KLOUD_KEY="+keyFile)
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 90, Rows: 33})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	out := &syncBuf{}
	go io.Copy(out, tty)
	waitOut := func(s string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() bool { return strings.Contains(out.String(), s) }, "kloud ssh never printed %q:\n%s", s, out.String())
	}
	waitOut("from-browser-42") // the replay
	waitOut("Ctrl-]")          // how to detach
	io.WriteString(tty, "stty size; echo from-cli-$((3*11))\r")
	waitOut("33 90")
	waitOut("from-cli-33")
	term.WaitFor(t, "from-cli-33") // the browser sees it too
	io.WriteString(tty, "\x1d.")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kloud ssh: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("kloud ssh did not detach:\n%s", out.String())
	}
	waitOut("detached")
	if s := e.sessions(cookie); len(s) != 1 || s[0].Session != "shared-tab" {
		t.Fatalf("session after detach: %+v", s)
	}
	// An unknown machine is named in the error.
	bad := exec.Command(bin, "ssh", "no-such-vm")
	bad.Env = cmd.Env
	b, err := bad.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "no-such-vm") {
		t.Fatalf("unknown machine: %v %s", err, b)
	}
}

type syncBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
