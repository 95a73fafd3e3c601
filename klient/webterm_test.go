package klient_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
	"github.com/kloud-dev/kloud/kontrol"
	"github.com/kloud-dev/kloud/kontrol/kontroltest"
)

const wait = 20 * time.Second

// env is a real kontrol, a real klient registered with it, and a stand-in for kloud's attach
// endpoint on the same origin (what kloud serves), which hands the test klient's side of each
// attachment as if it were the browser.
type env struct {
	t        *testing.T
	ko       *kontroltest.Env
	srv      *httptest.Server
	mach     *webtermtest.Machine
	keyFile  string
	kiteID   string
	stateDir string
	listen   string // klient's own listener (Options.Listen; "": none)
	kl       *klient.Klient
	conn     *kite.Conn // kloud's end of klient's registration connection
	stop     func()

	mu   sync.Mutex
	legs map[string]chan *websocket.Conn
	dl   []byte // served at klientapi.DownloadPath (upgrade_test.go); nil: 404
}

func newEnv(t *testing.T) *env { return newEnvKey(t, false) }

// newEnvKey is newEnv with klient holding, if agent is set, a machine agent's key (what kloud
// gives a machine) instead of a kite key of alice's.
func newEnvKey(t *testing.T, agent bool) *env {
	t.Helper()
	e := prepareEnv(t, agent)
	e.start()
	return e
}

// prepareEnv is newEnvKey without starting klient.
func prepareEnv(t *testing.T, agent bool) *env {
	t.Helper()
	testutil.RequireBinary(t, "bash")
	e := &env{t: t, ko: kontroltest.Start(t, kontroltest.Options{}), mach: webtermtest.New(t, "alice"),
		stateDir: t.TempDir(), legs: map[string]chan *websocket.Conn{}}
	mux := http.NewServeMux()
	mux.Handle("/kite", e.ko.Kite)
	mux.HandleFunc(webterm.AttachPath, e.attach)
	mux.HandleFunc(klientapi.DownloadPath, e.download)
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	if agent {
		key, id, err := e.ko.Kontrol.CreateAgentKey(kitekey.AgentKeySpec{Owner: "alice", MachineID: "m1", StackID: "s1", KontrolURL: e.srv.URL + "/kite"})
		if err != nil {
			t.Fatal(err)
		}
		e.keyFile, e.kiteID = filepath.Join(t.TempDir(), "kite.key"), id
		if err := kitekey.WriteFile(e.keyFile, key); err != nil {
			t.Fatal(err)
		}
	} else {
		e.keyFile, e.kiteID = e.ko.KeyFile("alice")
	}
	return e
}

// start runs klient until the test ends (or stop).
func (e *env) start() {
	e.t.Helper()
	ready := make(chan struct{}, 1)
	kl, err := klient.New(klient.Options{
		KiteKeyFile: e.keyFile, KontrolURL: e.srv.URL + "/kite", Root: e.mach.Root, StateDir: e.stateDir,
		Listen: e.listen, Logger: testutil.Logger(e.t),
		Ready: func(kontrol.RegisterResult) {
			select {
			case ready <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		kl.Run(ctx)
	}()
	var once sync.Once
	e.stop = func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(e.stop)
	select {
	case <-ready:
	case <-time.After(wait):
		e.t.Fatal("klient did not register")
	}
	e.kl, e.conn = kl, e.ko.Kontrol.Conn(e.kiteID)
	if e.conn == nil {
		e.t.Fatal("klient registered but kontrol has no connection")
	}
}

func (e *env) attach(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	ch := e.legs[r.URL.Query().Get("ticket")]
	delete(e.legs, r.URL.Query().Get("ticket"))
	e.mu.Unlock()
	if ch == nil {
		http.Error(w, "unknown ticket", http.StatusForbidden)
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ch <- ws
}

func (e *env) token(user string) string {
	e.t.Helper()
	tok, err := e.ko.Kontrol.Signer().Token(user, e.kiteID, time.Minute)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

func (e *env) call(method string, params, result any) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return e.conn.Call(ctx, method, params, result)
}

// connect calls webterm.connect with a fresh ticket and returns the attachment as the browser
// would see it.
func (e *env) connect(p webterm.ConnectParams) (*webtermtest.Term, webterm.ConnectResult, error) {
	e.t.Helper()
	ticket := rand.Text()
	ch := make(chan *websocket.Conn, 1)
	e.mu.Lock()
	e.legs[ticket] = ch
	e.mu.Unlock()
	if p.Cols == 0 {
		p.Cols, p.Rows = 80, 24
	}
	if p.Attach.URL == "" {
		p.Attach = webterm.Attach{URL: e.srv.URL + webterm.AttachPath, Ticket: ticket}
	}
	var res webterm.ConnectResult
	if err := e.call("webterm.connect", p, &res); err != nil {
		return nil, res, err
	}
	select {
	case ws := <-ch:
		l := webtermtest.NewTerm(ws)
		e.t.Cleanup(func() { ws.CloseNow() })
		return l, res, nil
	case <-time.After(wait):
		e.t.Fatal("klient did not dial the attach URL")
	}
	return nil, res, nil
}

func (e *env) mustConnect(user string, p webterm.ConnectParams) (*webtermtest.Term, webterm.ConnectResult) {
	e.t.Helper()
	p.Token = e.token(user)
	l, res, err := e.connect(p)
	if err != nil {
		e.t.Fatalf("webterm.connect as %s %+v: %v", user, p, err)
	}
	return l, res
}

func (e *env) share(user, grant string) {
	e.t.Helper()
	if err := e.call("klient.share", klient.ShareParams{Username: user, Grant: grant, Token: e.token("alice")}, nil); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) list(user string) []webterm.Info {
	e.t.Helper()
	var res webterm.ListResult
	if err := e.call("webterm.list", webterm.TokenParams{Token: e.token(user)}, &res); err != nil {
		e.t.Fatal(err)
	}
	return res.Sessions
}

func TestWebtermOverWebSocket(t *testing.T) {
	e := newEnv(t)
	l, res := e.mustConnect("alice", webterm.ConnectParams{Session: "main", Mode: webterm.ModeAttach})
	if res.Session != "main" || res.Mode != webterm.ModeCreate || !res.Created {
		t.Fatalf("connect: %+v", res)
	}
	l.Type(t, "echo hello-$((6*7))\r")
	l.WaitFor(t, "hello-42")
	l.Send(t, webterm.OpResize, []byte(`{"cols":120,"rows":40}`))
	l.Type(t, "stty size\r")
	l.WaitFor(t, "40 120")
	if s := e.list("alice"); len(s) != 1 || s[0].Cols != 120 || len(s[0].Viewers) != 1 {
		t.Fatalf("list: %+v", s)
	}
	// Frames that break the rules are ignored (unknown opcode) or refused (text).
	l.Send(t, 7, []byte("ignored"))
	// The browser goes away: the session stays.
	l.WS.Close(websocket.StatusNormalClosure, "")
	testutil.Eventually(t, wait, func() bool { s := e.list("alice"); return len(s) == 1 && len(s[0].Viewers) == 0 }, "viewer not detached")
	l2, res := e.mustConnect("alice", webterm.ConnectParams{Session: "main"})
	if res.Mode != webterm.ModeAttach || res.Created {
		t.Fatalf("reattach: %+v", res)
	}
	l2.WaitFor(t, "hello-42") // replayed
	l2.Type(t, "echo again-$((6*6))\r")
	l2.WaitFor(t, "again-36")
	l2.WS.Write(context.Background(), websocket.MessageText, []byte("not binary"))
	if c := l2.Closed(t); c.Code != webterm.CloseBadMessage {
		t.Fatalf("text frame: %+v", c)
	}
	// The session ends: its viewers are told why.
	l3, _ := e.mustConnect("alice", webterm.ConnectParams{Session: "main"})
	l3.Type(t, "exit 0\r")
	if c := l3.Closed(t); c.Code != webterm.CloseEnded || !strings.Contains(c.Reason, "exited") {
		t.Fatalf("exit: %+v", c)
	}
}

func TestReadonlyShareWatchesLiveAndUnshareCloses(t *testing.T) {
	e := newEnv(t)
	e.share("bob", klient.GrantReadonly)
	owner, _ := e.mustConnect("alice", webterm.ConnectParams{Session: "pair"})
	bob, res := e.mustConnect("bob", webterm.ConnectParams{Session: "pair", Mode: webterm.ModeReadonly, Cols: 20, Rows: 5})
	if res.Mode != webterm.ModeReadonly {
		t.Fatalf("%+v", res)
	}
	bob.Type(t, "echo bob-$((1+1))\r")
	bob.Send(t, webterm.OpResize, []byte(`{"cols":20,"rows":5}`))
	owner.Type(t, "echo owner-$((3+4))\r")
	owner.WaitFor(t, "owner-7")
	bob.WaitFor(t, "owner-7") // live
	if strings.Contains(owner.Output(), "bob-2") {
		t.Fatal("a read-only viewer's input ran")
	}
	if s := e.list("alice"); s[0].Cols != 80 {
		t.Fatalf("a read-only viewer resized the terminal: %+v", s[0])
	}
	// A read-only grant cannot ask for a writable attachment.
	if _, _, err := e.connect(webterm.ConnectParams{Session: "pair", Mode: webterm.ModeShared, Token: e.token("bob")}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("shared attach with a read-only grant: %v", err)
	}
	if err := e.call("klient.unshare", klient.UnshareParams{Username: "bob", Token: e.token("alice")}, nil); err != nil {
		t.Fatal(err)
	}
	if c := bob.Closed(t); c.Code != webterm.CloseUnshared {
		t.Fatalf("after unshare: %+v", c)
	}
	owner.Type(t, "echo still-$((2*5))\r")
	owner.WaitFor(t, "still-10")
	if _, _, err := e.connect(webterm.ConnectParams{Session: "pair", Mode: webterm.ModeReadonly, Token: e.token("bob")}); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("connect after unshare: %v", err)
	}
}

func TestDowngradeClosesWritableAttachments(t *testing.T) {
	testutil.RequireRoot(t) // a terminal share's shells run as an account klient creates
	e := newEnv(t)
	e.share("tom", klient.GrantFull)
	e.mustConnect("alice", webterm.ConnectParams{Session: "s"})
	rw, _ := e.mustConnect("tom", webterm.ConnectParams{Session: "s", Mode: webterm.ModeShared})
	ro, _ := e.mustConnect("tom", webterm.ConnectParams{Session: "s", Mode: webterm.ModeReadonly})
	// full → terminal: tom may no longer type as the owner.
	e.share("tom", klient.GrantTerminal)
	if c := rw.Closed(t); c.Code != webterm.CloseUnshared || !strings.Contains(c.Reason, "owner's account") {
		t.Fatalf("writable attachment to the owner's session after full → terminal: %+v", c)
	}
	if !ro.Open() {
		t.Fatalf("read-only attachment closed too: %+v", ro.Closed(t))
	}
	own, _ := e.mustConnect("tom", webterm.ConnectParams{Session: "tom-own"})
	own.Type(t, "echo own-$((4*4))\r")
	own.WaitFor(t, "own-16")
	// terminal → readonly: his own session's writable attachment goes too.
	e.share("tom", klient.GrantReadonly)
	if c := own.Closed(t); c.Code != webterm.CloseUnshared || !strings.Contains(c.Reason, "read-only") {
		t.Fatalf("writable attachment after the downgrade: %+v", c)
	}
	if !ro.Open() {
		t.Fatalf("read-only attachment closed too: %+v", ro.Closed(t))
	}
	// setShares replaces the list: tom is gone, so is his read-only attachment.
	if err := e.call("klient.setShares", klient.SetSharesParams{Shares: []klient.Share{{Username: "zoe", Grant: klient.GrantFull}}, Token: e.token("alice")}, nil); err != nil {
		t.Fatal(err)
	}
	if c := ro.Closed(t); c.Code != webterm.CloseUnshared {
		t.Fatalf("after setShares: %+v", c)
	}
}

func TestSharesSurviveRestart(t *testing.T) {
	testutil.RequireRoot(t) // tom's terminal share runs as an account klient creates
	e := newEnv(t)
	e.share("bob", klient.GrantReadonly)
	e.share("tom", klient.GrantTerminal)
	e.stop()
	e.start()
	var res klient.SharesResult
	if err := e.call("klient.shared", webterm.TokenParams{Token: e.token("alice")}, &res); err != nil {
		t.Fatal(err)
	}
	want := []klient.Share{{Username: "bob", Grant: klient.GrantReadonly}, {Username: "tom", Grant: klient.GrantTerminal}}
	if fmt.Sprint(res.Shares) != fmt.Sprint(want) {
		t.Fatalf("after restart: %+v", res.Shares)
	}
	// And they are enforced before kloud pushes anything.
	e.mustConnect("tom", webterm.ConnectParams{})
}

func TestAttachURLMustBeOnKontrolsOrigin(t *testing.T) {
	e := newEnv(t)
	other := httptest.NewServer(http.NotFoundHandler())
	defer other.Close()
	for _, u := range []string{other.URL + webterm.AttachPath, e.srv.URL + "/elsewhere", "ws://user@" + strings.TrimPrefix(e.srv.URL, "http://") + webterm.AttachPath} {
		_, _, err := e.connect(webterm.ConnectParams{Token: e.token("alice"), Attach: webterm.Attach{URL: u, Ticket: "t"}})
		if err == nil || !strings.Contains(err.Error(), "kontrol's origin") {
			t.Fatalf("attach url %s: %v", u, err)
		}
	}
	if s := e.list("alice"); len(s) != 0 {
		t.Fatalf("a refused connect left sessions: %+v", s)
	}
}

// TestAuthzMatrix calls every webterm and share method as the owner, each grant, another user,
// with an expired token, a token for another kite and no token.
func TestAuthzMatrix(t *testing.T) {
	testutil.RequireRoot(t) // a terminal share's shells run as an account klient creates
	e := newEnv(t)
	e.share("frank", klient.GrantFull)
	e.share("tom", klient.GrantTerminal)
	e.share("rita", klient.GrantReadonly)
	base, _ := e.mustConnect("alice", webterm.ConnectParams{Session: "base"})
	base.WS.Close(websocket.StatusNormalClosure, "")

	past := *e.ko.Kontrol.Signer()
	past.Now = func() time.Time { return time.Now().Add(-2 * time.Hour) }
	expired, err := past.Token("alice", e.kiteID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	otherKite, err := e.ko.Kontrol.Signer().Token("alice", "some-other-kite", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	type caller struct{ name, user, token string }
	callers := []caller{
		{"owner", "alice", ""}, {"full", "frank", ""}, {"terminal", "tom", ""}, {"readonly", "rita", ""},
		{"stranger", "sam", ""}, {"expired", "alice", expired}, {"otherKite", "alice", otherKite}, {"noToken", "alice", "-"},
	}
	n := 0
	fresh := func(user string) string { // a session started by user
		n++
		id := fmt.Sprintf("s%d", n)
		l, _ := e.mustConnect(user, webterm.ConnectParams{Session: id})
		l.WS.Close(websocket.StatusNormalClosure, "")
		return id
	}
	type method struct {
		name string
		ok   []string // callers allowed; the grants not listed get permissionDenied
		call func(tok string) error
	}
	rpc := func(m string, p func(tok string) any) func(string) error {
		return func(tok string) error { return e.call(m, p(tok), nil) }
	}
	connect := func(p webterm.ConnectParams) func(string) error {
		return func(tok string) error {
			p.Token = tok
			l, _, err := e.connect(p)
			if l != nil {
				l.WS.Close(websocket.StatusNormalClosure, "")
			}
			return err
		}
	}
	methods := []method{
		{"webterm.connect create", []string{"owner", "full", "terminal"}, connect(webterm.ConnectParams{Mode: webterm.ModeCreate})},
		// A terminal share types only into sessions of its own account; "base" is the owner's.
		{"webterm.connect attach of the owner's session", []string{"owner", "full"}, connect(webterm.ConnectParams{Session: "base"})},
		{"webterm.connect shared of the owner's session", []string{"owner", "full"}, connect(webterm.ConnectParams{Session: "base", Mode: webterm.ModeShared})},
		{"webterm.connect readonly", []string{"owner", "full", "terminal", "readonly"}, connect(webterm.ConnectParams{Session: "base", Mode: webterm.ModeReadonly})},
		{"webterm.list", []string{"owner", "full", "terminal", "readonly"}, rpc("webterm.list", func(tok string) any { return webterm.TokenParams{Token: tok} })},
		{"webterm.resize of the owner's session", []string{"owner", "full"}, rpc("webterm.resize", func(tok string) any { return webterm.ResizeParams{Session: "base", Cols: 90, Rows: 30, Token: tok} })},
		{"webterm.rename of the owner's session", []string{"owner", "full"}, rpc("webterm.rename", func(tok string) any { return webterm.RenameParams{Session: "base", Name: "n", Token: tok} })},
		{"webterm.kill of the owner's session", []string{"owner", "full"}, func(tok string) error {
			return e.call("webterm.kill", webterm.SessionParams{Session: fresh("alice"), Token: tok}, nil)
		}},
		{"klient.share", []string{"owner"}, rpc("klient.share", func(tok string) any {
			return klient.ShareParams{Username: "zed", Grant: klient.GrantReadonly, Token: tok}
		})},
		{"klient.unshare", []string{"owner"}, rpc("klient.unshare", func(tok string) any { return klient.UnshareParams{Username: "zed", Token: tok} })},
		{"klient.shared", []string{"owner"}, rpc("klient.shared", func(tok string) any { return webterm.TokenParams{Token: tok} })},
		{"klient.setShares", []string{"owner"}, rpc("klient.setShares", func(tok string) any {
			return klient.SetSharesParams{Token: tok, Shares: []klient.Share{
				{Username: "frank", Grant: klient.GrantFull}, {Username: "tom", Grant: klient.GrantTerminal}, {Username: "rita", Grant: klient.GrantReadonly}}}
		})},
	}
	for _, m := range methods {
		for _, c := range callers {
			tok := c.token
			switch tok {
			case "":
				tok = e.token(c.user)
			case "-":
				tok = ""
			}
			err := m.call(tok)
			want := "permissionDenied"
			switch {
			case c.name == "expired" || c.name == "otherKite" || c.name == "noToken":
				want = "authenticationError"
			case strings.Contains(" "+strings.Join(m.ok, " ")+" ", " "+c.name+" "):
				want = "ok"
			}
			got := "ok"
			var ke *kite.Error
			if errors.As(err, &ke) {
				got = ke.Type()
			} else if err != nil {
				got = err.Error()
			}
			if got != want {
				t.Errorf("%s as %s: got %s (%v), want %s", m.name, c.name, got, err, want)
			}
		}
	}
	// A terminal grant manages the sessions it started.
	own := fresh("tom")
	if err := e.call("webterm.rename", webterm.RenameParams{Session: own, Name: "mine", Token: e.token("tom")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.call("webterm.kill", webterm.SessionParams{Session: own, Token: e.token("tom")}, nil); err != nil {
		t.Fatal(err)
	}
	// The owner cannot be given a share.
	if err := e.call("klient.share", klient.ShareParams{Username: "alice", Grant: klient.GrantReadonly, Token: e.token("alice")}, nil); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("sharing with the owner: %v", err)
	}
	var info webterm.Info
	if err := e.call("webterm.rename", webterm.RenameParams{Session: "base", Name: "renamed", Token: e.token("alice")}, &info); err != nil || info.Name != "renamed" {
		t.Fatalf("rename: %+v %v", info, err)
	}
}
