package webterm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/selfexec"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
)

const wait = 20 * time.Second // generous deadline for polls; never a timed assertion

func newManager(t *testing.T, o webterm.Options) (*webterm.Manager, *webtermtest.Machine) {
	t.Helper()
	testutil.RequireBinary(t, "bash")
	mach := webtermtest.New(t, "alice")
	o.Owner, o.Root, o.Logger = "alice", mach.Root, testutil.Logger(t)
	if os.Getenv("WEBTERM_HOLDERS") != "" && o.SessionDir == "" {
		o.SessionDir, o.HolderEnv = filepath.Join(t.TempDir(), "sessions"), selfexec.Env()
	}
	m, err := webterm.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, mach
}

func open(t *testing.T, m *webterm.Manager, r webterm.OpenRequest) *webterm.Viewer {
	t.Helper()
	if r.Cols == 0 {
		r.Cols, r.Rows = 80, 24
	}
	if r.User == "" {
		r.User = "alice"
	}
	v, _, err := m.Open(r)
	if err != nil {
		t.Fatalf("open %+v: %v", r, err)
	}
	return v
}

// output collects what a viewer receives, in the background.
type output struct {
	v    *webterm.Viewer
	mu   sync.Mutex
	buf  bytes.Buffer
	n    int64
	keep bool
	done chan struct{}
	err  error
}

func collect(v *webterm.Viewer) *output {
	o := &output{v: v, keep: true, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		b := make([]byte, 64<<10)
		for {
			n, err := v.Next(context.Background(), b)
			o.mu.Lock()
			o.n += int64(n)
			if o.keep {
				o.buf.Write(b[:n])
				if o.buf.Len() > 1<<20 { // keep the tail only
					tail := append([]byte(nil), o.buf.Bytes()[o.buf.Len()-(64<<10):]...)
					o.buf.Reset()
					o.buf.Write(tail)
				}
			}
			if err != nil {
				o.err = err
				o.mu.Unlock()
				return
			}
			o.mu.Unlock()
		}
	}()
	return o
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

func (o *output) bytes() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

func (o *output) waitFor(t *testing.T, s string) {
	t.Helper()
	testutil.Eventually(t, wait, func() bool { return strings.Contains(o.String(), s) }, "output never showed %q; got:\n%s", s, o.tail())
}

func (o *output) tail() string {
	s := o.String()
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}

// end waits for the viewer to end and returns why.
func (o *output) end(t *testing.T) *webterm.EndError {
	t.Helper()
	select {
	case <-o.done:
	case <-time.After(wait):
		t.Fatal("viewer did not end")
	}
	var ee *webterm.EndError
	if !errors.As(o.err, &ee) {
		t.Fatalf("viewer ended with %v, want an *EndError", o.err)
	}
	return ee
}

func typeIn(t *testing.T, v *webterm.Viewer, s string) {
	t.Helper()
	if err := v.Input([]byte(s)); err != nil {
		t.Fatalf("input %q: %v", s, err)
	}
}

func TestShellRunsAsOwnerInHome(t *testing.T) {
	m, mach := newManager(t, webterm.Options{})
	v := open(t, m, webterm.OpenRequest{})
	out := collect(v)
	typeIn(t, v, `echo "uid=$(id -u) gid=$(id -g) pwd=$PWD term=$TERM user=$USER end"`+"\r")
	want := fmt.Sprintf("uid=%d gid=%d pwd=%s term=xterm-256color user=alice end", mach.UID, mach.UID, mach.Home)
	out.waitFor(t, want)
	typeIn(t, v, "tty; ps -o sid= -p $$; echo pid=$$\r") // a real terminal, session leader
	out.waitFor(t, "/dev/pts/")
}

func TestEchoAndList(t *testing.T) {
	m, _ := newManager(t, webterm.Options{})
	v := open(t, m, webterm.OpenRequest{Cols: 100, Rows: 30})
	out := collect(v)
	typeIn(t, v, "echo hello-$((6*7))\r")
	out.waitFor(t, "hello-42")
	typeIn(t, v, "stty size\r")
	out.waitFor(t, "30 100")
	ls := m.List()
	if len(ls) != 1 || ls[0].Session != v.Session() || ls[0].CreatedBy != "alice" || ls[0].Cols != 100 || ls[0].Rows != 30 ||
		len(ls[0].Viewers) != 1 || ls[0].Viewers[0].Mode != webterm.ModeCreate {
		t.Fatalf("list: %+v", ls)
	}
}

func TestReattachReplaysAndContinues(t *testing.T) {
	m, _ := newManager(t, webterm.Options{})
	v := open(t, m, webterm.OpenRequest{Session: "tab1", Mode: webterm.ModeAttach})
	out := collect(v)
	typeIn(t, v, "echo before-$((1+1))\r")
	out.waitFor(t, "before-2")
	pid := m.List()[0].PID
	v.Close()
	if e := out.end(t); e.Code != webterm.CloseNormal {
		t.Fatalf("detach: %+v", e)
	}
	// The shell lives on without viewers.
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("shell gone after detach: %v", err)
	}
	if ls := m.List(); len(ls) != 1 || len(ls[0].Viewers) != 0 {
		t.Fatalf("after detach: %+v", ls)
	}
	v2, created, err := m.Open(webterm.OpenRequest{Session: "tab1", Mode: webterm.ModeAttach, User: "alice", Cols: 80, Rows: 24})
	if err != nil || created || v2.Mode() != webterm.ModeAttach {
		t.Fatalf("reattach: created=%v mode=%s err=%v", created, v2.Mode(), err)
	}
	out2 := collect(v2)
	out2.waitFor(t, "before-2") // the replay
	typeIn(t, v2, "echo after-$((2+2))\r")
	out2.waitFor(t, "after-4")
	if m.List()[0].PID != pid {
		t.Fatal("reattach started a new shell")
	}
}

func TestScrollbackIsBounded(t *testing.T) {
	m, _ := newManager(t, webterm.Options{Scrollback: 4 << 10})
	v := open(t, m, webterm.OpenRequest{Session: "s"})
	out := collect(v)
	typeIn(t, v, "for i in $(seq 1 2000); do echo line-$i; done; echo end-$((3*3))\r")
	out.waitFor(t, "end-9")
	v.Close()
	v2 := open(t, m, webterm.OpenRequest{Session: "s", Mode: webterm.ModeShared})
	b := make([]byte, 64<<10)
	n, err := v2.Next(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	replay := string(b[:n])
	if n > 4<<10 || !strings.Contains(replay, "end-9") || strings.Contains(replay, "line-1\r\n") {
		t.Fatalf("replay of %d bytes: %q", n, replay)
	}
}

func TestManyViewersSeeAndType(t *testing.T) {
	m, _ := newManager(t, webterm.Options{})
	a := open(t, m, webterm.OpenRequest{Session: "pair"})
	b := open(t, m, webterm.OpenRequest{Session: "pair", User: "bob", Mode: webterm.ModeShared})
	c := open(t, m, webterm.OpenRequest{Session: "pair", User: "carol", Mode: webterm.ModeReadonly})
	oa, ob, oc := collect(a), collect(b), collect(c)
	typeIn(t, a, "echo from-a-$((1+10))\r")
	typeIn(t, b, "echo from-b-$((2+20))\r")
	for _, o := range []*output{oa, ob, oc} {
		o.waitFor(t, "from-a-11")
		o.waitFor(t, "from-b-22")
	}
	if vs := m.List()[0].Viewers; len(vs) != 3 {
		t.Fatalf("viewers: %+v", vs)
	}
}

func TestReadonlyCannotTypeOrResize(t *testing.T) {
	m, _ := newManager(t, webterm.Options{})
	w := open(t, m, webterm.OpenRequest{Session: "s", Cols: 80, Rows: 24})
	ro := open(t, m, webterm.OpenRequest{Session: "s", User: "bob", Mode: webterm.ModeReadonly, Cols: 40, Rows: 10})
	ow, oro := collect(w), collect(ro)
	if err := ro.Input([]byte("echo ro-$((1+1))\r")); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("read-only input: %v", err)
	}
	if err := ro.Resize(50, 10); !errors.Is(err, kite.ErrPermission) {
		t.Fatalf("read-only resize: %v", err)
	}
	// Had the read-only input reached the shell, it would run before this.
	typeIn(t, w, "echo rw-$((2+2))\r")
	ow.waitFor(t, "rw-4")
	oro.waitFor(t, "rw-4") // it does watch
	if strings.Contains(ow.String(), "ro-2") {
		t.Fatalf("read-only input ran:\n%s", ow.String())
	}
	if in := m.List()[0]; in.Cols != 80 || in.Rows != 24 {
		t.Fatalf("read-only attach resized the terminal: %+v", in)
	}
}

func TestModes(t *testing.T) {
	m, _ := newManager(t, webterm.Options{})
	for _, mode := range []string{webterm.ModeShared, webterm.ModeReadonly} {
		if _, _, err := m.Open(webterm.OpenRequest{Session: "nope", User: "alice", Mode: mode, Cols: 80, Rows: 24}); !errors.Is(err, kite.ErrNotFound) {
			t.Fatalf("%s of a missing session: %v", mode, err)
		}
	}
	v := open(t, m, webterm.OpenRequest{Session: "x", Mode: webterm.ModeCreate})
	if v.Mode() != webterm.ModeCreate {
		t.Fatal(v.Mode())
	}
	if _, _, err := m.Open(webterm.OpenRequest{Session: "x", User: "alice", Mode: webterm.ModeCreate, Cols: 80, Rows: 24}); !errors.Is(err, kite.ErrConflict) {
		t.Fatalf("create of an existing session: %v", err)
	}
	for _, bad := range []webterm.OpenRequest{
		{Session: "a/b", User: "alice", Cols: 80, Rows: 24},
		{User: "alice", Cols: 0, Rows: 24},
		{User: "alice", Cols: 80, Rows: 24, Mode: "screen"},
	} {
		if _, _, err := m.Open(bad); !errors.Is(err, kite.ErrInvalidParams) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}

func TestKill(t *testing.T) {
	m, _ := newManager(t, webterm.Options{})
	v := open(t, m, webterm.OpenRequest{})
	out := collect(v)
	typeIn(t, v, "echo up-$((5*5))\r")
	out.waitFor(t, "up-25")
	pid := m.List()[0].PID
	if err := m.Kill(v.Session(), "session ended: killed by alice"); err != nil {
		t.Fatal(err)
	}
	e := out.end(t)
	if e.Code != webterm.CloseEnded || !strings.Contains(e.Reason, "killed by alice") {
		t.Fatalf("end: %+v", e)
	}
	if len(m.List()) != 0 {
		t.Fatalf("still listed: %+v", m.List())
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("shell %d still running", pid)
	}
	if err := m.Kill(v.Session(), "again"); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("kill of a gone session: %v", err)
	}
}

func TestKillOfShellIgnoringHangup(t *testing.T) {
	m, _ := newManager(t, webterm.Options{KillGrace: 200 * time.Millisecond})
	v := open(t, m, webterm.OpenRequest{})
	out := collect(v)
	typeIn(t, v, "trap '' HUP; echo trapped-$((4+4))\r")
	out.waitFor(t, "trapped-8")
	if err := m.Kill(v.Session(), "killed"); err != nil {
		t.Fatal(err)
	}
	if e := out.end(t); e.Code != webterm.CloseEnded {
		t.Fatalf("end: %+v", e)
	}
}

func TestShellExitEndsSession(t *testing.T) {
	m, _ := newManager(t, webterm.Options{})
	v := open(t, m, webterm.OpenRequest{})
	out := collect(v)
	typeIn(t, v, "echo bye-$((9-1)); exit 3\r")
	e := out.end(t)
	if e.Code != webterm.CloseEnded || !strings.Contains(e.Reason, "status 3") || !strings.Contains(out.String(), "bye-8") {
		t.Fatalf("end %+v after %q", e, out.String())
	}
	testutil.Eventually(t, wait, func() bool { return len(m.List()) == 0 }, "session still listed")
}

func TestRename(t *testing.T) {
	m, _ := newManager(t, webterm.Options{})
	v := open(t, m, webterm.OpenRequest{})
	if err := m.Rename(v.Session(), "build logs"); err != nil {
		t.Fatal(err)
	}
	if in, _ := m.Info(v.Session()); in.Name != "build logs" || in.Session != v.Session() {
		t.Fatalf("%+v", in)
	}
	if err := m.Rename("missing", "x"); !errors.Is(err, kite.ErrNotFound) {
		t.Fatal(err)
	}
}

func TestOrphanTimeout(t *testing.T) {
	m, _ := newManager(t, webterm.Options{IdleTimeout: 300 * time.Millisecond})
	orphan := open(t, m, webterm.OpenRequest{Session: "orphan"})
	watched := open(t, m, webterm.OpenRequest{Session: "watched"})
	ow := collect(watched)
	oo := collect(orphan)
	orphan.Close()
	oo.end(t)
	testutil.Eventually(t, wait, func() bool {
		_, err := m.Info("orphan")
		return errors.Is(err, kite.ErrNotFound)
	}, "orphaned session not ended")
	// The session with a viewer was never idle.
	typeIn(t, watched, "echo alive-$((7*7))\r")
	ow.waitFor(t, "alive-49")
	// A reattach before the timeout cancels it: detach, attach again, and it survives the
	// other orphan's lifetime.
	watched.Close()
	again := open(t, m, webterm.OpenRequest{Session: "watched", Mode: webterm.ModeShared})
	oa := collect(again)
	third := open(t, m, webterm.OpenRequest{Session: "third"})
	third.Close()
	testutil.Eventually(t, wait, func() bool {
		_, err := m.Info("third")
		return errors.Is(err, kite.ErrNotFound)
	}, "third session not ended")
	typeIn(t, again, "echo still-$((8*8))\r")
	oa.waitFor(t, "still-64")
}

func TestSessionLimitPerUser(t *testing.T) {
	m, _ := newManager(t, webterm.Options{MaxSessionsPerUser: 2})
	open(t, m, webterm.OpenRequest{})
	open(t, m, webterm.OpenRequest{})
	if _, _, err := m.Open(webterm.OpenRequest{User: "alice", Cols: 80, Rows: 24}); !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("third session: %v", err)
	}
	open(t, m, webterm.OpenRequest{User: "bob"}) // counted per user
	// Joining is not creating.
	open(t, m, webterm.OpenRequest{Session: m.List()[0].Session, Mode: webterm.ModeShared})
}

func TestUnknownOwner(t *testing.T) {
	m, mach := newManager(t, webterm.Options{})
	mach.WritePasswd(t, "root:x:0:0:root:/root:/bin/bash\n")
	_, _, err := m.Open(webterm.OpenRequest{User: "alice", Cols: 80, Rows: 24})
	if err == nil || !errors.Is(err, kite.ErrState) || !strings.Contains(err.Error(), "alice") {
		t.Fatalf("open without an account: %v", err)
	}
}

// yes floods a session while its viewer reads everything: output keeps flowing, the queue
// stays bounded and memory does not grow with the output.
func TestFlowControlYesDrained(t *testing.T) {
	const queue = 64 << 10
	m, _ := newManager(t, webterm.Options{ViewerQueue: queue})
	v := open(t, m, webterm.OpenRequest{})
	out := &output{v: v}
	out.done = make(chan struct{})
	var maxQueued int
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak uint64
	typeIn(t, v, "yes\r")
	b := make([]byte, 64<<10)
	var total int64
	for total < 16<<20 {
		n, err := v.Next(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		total += int64(n)
		if q := v.Queued(); q > maxQueued {
			maxQueued = q
		}
		if total%(8<<20) < int64(n) {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
		}
	}
	t.Logf("read %d MiB of yes; max queued %d KiB; heap %d → peak %d KiB", total>>20, maxQueued>>10, base>>10, peak>>10)
	if maxQueued > queue+32<<10 {
		t.Fatalf("queue grew to %d bytes, bound %d", maxQueued, queue+32<<10)
	}
	if peak > base+32<<20 {
		t.Fatalf("heap grew from %d to %d bytes while streaming", base, peak)
	}
	typeIn(t, v, "\x03")
	typeIn(t, v, "echo done-$((2+3))\r")
	o := collect(v)
	o.waitFor(t, "done-5")
}

// While a viewer does not read at all, yes is held back (the reader waits, the queue stays
// at its bound), and Ctrl-C still reaches the shell at once.
func TestFlowControlYesStalledCtrlC(t *testing.T) {
	const queue = 64 << 10
	m, _ := newManager(t, webterm.Options{ViewerQueue: queue, SlowViewerTimeout: time.Hour})
	v := open(t, m, webterm.OpenRequest{})
	typeIn(t, v, "yes\r")
	testutil.Eventually(t, wait, func() bool { return v.Queued() >= queue }, "queue never filled: %d", v.Queued())
	// The reader waits: nothing more is queued, however long yes runs.
	for range 5 {
		if q := v.Queued(); q > queue+32<<10 {
			t.Fatalf("queued %d bytes past the bound", q)
		}
		time.Sleep(50 * time.Millisecond) // give yes time to push (not synchronisation)
	}
	done := make(chan error, 1)
	go func() { done <- v.Input([]byte("\x03")) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(wait):
		t.Fatal("Ctrl-C blocked behind output")
	}
	typeIn(t, v, "echo done-$((2+3))\r")
	o := collect(v)
	o.waitFor(t, "done-5")
}

// A viewer that stops reading is dropped after SlowViewerTimeout; the others go on.
func TestSlowViewerDropped(t *testing.T) {
	m, _ := newManager(t, webterm.Options{ViewerQueue: 32 << 10, SlowViewerTimeout: 300 * time.Millisecond})
	fast := open(t, m, webterm.OpenRequest{Session: "s"})
	slow := open(t, m, webterm.OpenRequest{Session: "s", User: "bob", Mode: webterm.ModeReadonly})
	of := collect(fast)
	of.mu.Lock()
	of.keep = false
	of.mu.Unlock()
	typeIn(t, fast, "yes\r")
	select {
	case <-slow.Done():
	case <-time.After(wait):
		t.Fatal("slow viewer not dropped")
	}
	if e := slow.Err(); e.Code != webterm.CloseTooSlow || !strings.Contains(e.Reason, "too slow") {
		t.Fatalf("slow viewer: %+v", e)
	}
	if slow.Queued() != 0 {
		t.Fatal("dropped viewer kept its queue")
	}
	n := of.bytes()
	testutil.Eventually(t, wait, func() bool { return of.bytes() > n+1<<20 }, "fast viewer stopped getting output")
	typeIn(t, fast, "\x03")
	of.mu.Lock()
	of.keep = true
	of.mu.Unlock()
	typeIn(t, fast, "echo done-$((2+3))\r")
	of.waitFor(t, "done-5")
}

// Sessions flooding their viewers (one drained as fast as it goes, one not read at all) do not
// slow another session.
func TestOtherSessionsResponsiveDuringYes(t *testing.T) {
	m, _ := newManager(t, webterm.Options{SlowViewerTimeout: time.Hour})
	flood := open(t, m, webterm.OpenRequest{Session: "flood"})
	of := collect(flood)
	of.mu.Lock()
	of.keep = false
	of.mu.Unlock()
	typeIn(t, flood, "yes\r")
	stalled := open(t, m, webterm.OpenRequest{Session: "stalled"})
	typeIn(t, stalled, "yes\r")
	testutil.Eventually(t, wait, func() bool { return of.bytes() > 1<<20 && stalled.Queued() >= webterm.DefaultViewerQueue },
		"floods not flowing: %d bytes drained, %d queued", of.bytes(), stalled.Queued())
	other := open(t, m, webterm.OpenRequest{Session: "other"})
	oo := collect(other)
	for i := range 5 {
		typeIn(t, other, fmt.Sprintf("echo other-%d-$((%d*3))\r", i, i))
		oo.waitFor(t, fmt.Sprintf("other-%d-%d", i, i*3))
	}
	typeIn(t, flood, "\x03")
	typeIn(t, stalled, "\x03")
}
