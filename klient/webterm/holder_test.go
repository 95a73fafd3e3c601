package webterm_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/selfexec"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
)

// TestMain lets this test binary be a session holder too, as klient's binary is
// (Options.HolderCommand's default runs /proc/self/exe session-hold ID).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == webterm.HolderArg {
		os.Exit(webterm.HolderMain())
	}
	if sock := os.Getenv("WEBTERM_TEST_DIAL"); sock != "" { // TestHolderRefusesOtherUsers' intruder
		c, err := net.Dial("unix", sock)
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(0)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(make([]byte, 64))
		fmt.Printf("read %d bytes: %v\n", n, err)
		os.Exit(0)
	}
	if os.Getenv("WEBTERM_HOLDERS") != "" {
		fmt.Println("WEBTERM_HOLDERS is set: every Manager of the tests keeps its shells in holders")
		os.Exit(m.Run())
	}
	code := m.Run()
	if code == 0 {
		// Every test again with the shells in holders (what klient does on a machine), in a
		// child: the same semantics must hold there.
		var args []string
		for _, a := range os.Args[1:] {
			if !strings.HasPrefix(a, "-test.testlogfile") { // go test's cache log is the parent's
				args = append(args, a)
			}
		}
		cmd := exec.Command("/proc/self/exe", args...)
		cmd.Env = append(os.Environ(), "WEBTERM_HOLDERS=1")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("the tests with shells in holders failed:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// holderOptions are Options whose sessions live in holders under a directory of the test.
func holderOptions(t *testing.T, o webterm.Options) webterm.Options {
	t.Helper()
	o.SessionDir = filepath.Join(t.TempDir(), "sessions")
	o.HolderEnv = selfexec.Env()
	return o
}

func holders(id string) []int { return webtermtest.Holders(id) }

func zombie(pid int) bool { return webtermtest.Zombie(pid) }

func uniqueID(t *testing.T) string { return webtermtest.UniqueSession(t) }

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil && !zombie(pid) }

// TestHolderSurvivesManagerRestart: a shell with a background job lives on in its holder when
// its Manager goes away (Detach, as klient does on SIGTERM); a new Manager on the same directory
// finds it: same shell pid, background job alive, scrollback replayed, typing works. Killing the
// session then ends the holder and the shell: nothing is left.
func TestHolderSurvivesManagerRestart(t *testing.T) {
	o := holderOptions(t, webterm.Options{})
	id := uniqueID(t)
	m1, mach := newManager(t, o)
	o.Owner, o.Root, o.Logger = "alice", mach.Root, testutil.Logger(t)
	v := open(t, m1, webterm.OpenRequest{Session: id, Cols: 100, Rows: 30})
	out := collect(v)
	typeIn(t, v, "sleep 1000 & echo bg=$! sh=$$ mark-$((20+3))\r")
	out.waitFor(t, "mark-23")
	mm := regexp.MustCompile(`bg=(\d+) sh=(\d+)`).FindStringSubmatch(out.String())
	if mm == nil {
		t.Fatalf("no pids in %q", out.String())
	}
	bg, _ := strconv.Atoi(mm[1])
	sh, _ := strconv.Atoi(mm[2])
	if pid := m1.List()[0].PID; pid != sh {
		t.Fatalf("Info.PID %d, shell says $$=%d", pid, sh)
	}
	if err := m1.Rename(id, "my tab"); err != nil {
		t.Fatal(err)
	}
	hs := holders(id)
	if len(hs) != 1 {
		t.Fatalf("holders of the session: %v, want one", hs)
	}

	m1.Detach() // klient goes away
	if e := out.end(t); e.Code != webterm.CloseGoingAway || !strings.Contains(e.Reason, "restarting") {
		t.Fatalf("viewer of a detached Manager: %+v", e)
	}
	if !alive(sh) || !alive(bg) || !alive(hs[0]) {
		t.Fatalf("after Detach: shell alive %v, background job alive %v, holder alive %v", alive(sh), alive(bg), alive(hs[0]))
	}
	if _, _, err := m1.Open(webterm.OpenRequest{User: "alice", Cols: 80, Rows: 24}); err == nil {
		t.Fatal("a detached Manager opened a session")
	}

	m2, err := webterm.New(o) // the next klient
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m2.Close)
	ls := m2.List()
	if len(ls) != 1 || ls[0].Session != id || ls[0].PID != sh || ls[0].Name != "my tab" || ls[0].CreatedBy != "alice" ||
		ls[0].RunAs != "alice" || ls[0].Cols != 100 || ls[0].Rows != 30 {
		t.Fatalf("restored sessions: %+v (shell pid %d)", ls, sh)
	}
	if ah := m2.AdoptedHolders(); len(ah) != 1 || ah[0] != hs[0] {
		t.Fatalf("adopted holders %v, want [%d]", ah, hs[0])
	}
	v2 := open(t, m2, webterm.OpenRequest{Session: id, Cols: 100, Rows: 30})
	out2 := collect(v2)
	out2.waitFor(t, "mark-23") // the replay
	typeIn(t, v2, "jobs; echo again-$$-$((5*5))\r")
	out2.waitFor(t, fmt.Sprintf("again-%d-25", sh))
	out2.waitFor(t, "sleep 1000")

	if err := m2.Kill(id, "done"); err != nil {
		t.Fatal(err)
	}
	if e := out2.end(t); e.Code != webterm.CloseEnded || e.Reason != "done" {
		t.Fatalf("killed: %+v", e)
	}
	testutil.Eventually(t, wait, func() bool { return !alive(sh) && !alive(hs[0]) && len(holders(id)) == 0 },
		"after Kill: shell alive %v, holder alive %v", alive(sh), alive(hs[0]))
	testutil.Eventually(t, wait, func() bool {
		ents, _ := os.ReadDir(o.SessionDir)
		return len(ents) == 0
	}, "the session dir is not empty after the session ended")
	// The background job had the hangup; bash does not SIGHUP background jobs of a non-login
	// shell, so it may live: it is the user's, as with any hangup, and not a holder.
	if alive(bg) {
		syscall.Kill(bg, syscall.SIGKILL)
	}
}

// TestHolderKillWithStubbornJob: a killed session whose shell ignores the hangup (it ends by
// SIGKILL) and leaves a background job that keeps the terminal open still ends for its viewers
// after the kill's grace, and its holder goes: closing the PTY master interrupts the holder's read (ci54: with the master
// blocking, the holder waited on it, never sent the shell's end, and outlived it).
func TestHolderKillWithStubbornJob(t *testing.T) {
	o := holderOptions(t, webterm.Options{KillGrace: 500 * time.Millisecond})
	id := uniqueID(t)
	m, _ := newManager(t, o)
	v := open(t, m, webterm.OpenRequest{Session: id})
	out := collect(v)
	// The shell ignores the hangup too: it ends by the SIGKILL after KillGrace, silently, so no
	// output after the kill wakes the holder's read.
	typeIn(t, v, "trap '' HUP; (exec sleep 1000) & echo bg=$! sh=$$ ok-$((5*5))\r")
	out.waitFor(t, "ok-25")
	mm := regexp.MustCompile(`bg=(\d+) sh=(\d+)`).FindStringSubmatch(out.String())
	if mm == nil {
		t.Fatalf("no pids in %q", out.String())
	}
	bg, _ := strconv.Atoi(mm[1])
	sh, _ := strconv.Atoi(mm[2])
	t.Cleanup(func() { syscall.Kill(bg, syscall.SIGKILL) })
	hs := holders(id)
	if len(hs) != 1 {
		t.Fatalf("holders: %v", hs)
	}
	start := time.Now()
	if err := m.Kill(id, "done"); err != nil {
		t.Fatal(err)
	}
	if e := out.end(t); e.Code != webterm.CloseEnded || e.Reason != "done" {
		t.Fatalf("killed: %+v", e)
	}
	testutil.Eventually(t, wait, func() bool { return !alive(sh) && !alive(hs[0]) && len(holders(id)) == 0 },
		"after Kill: shell alive %v, holder alive %v (background job alive %v)", alive(sh), alive(hs[0]), alive(bg))
	t.Logf("shell and holder gone %v after the kill; the background job alive: %v", time.Since(start).Round(time.Millisecond), alive(bg))
}

// TestHolderKilledEndsSession: a holder that dies (SIGKILL) ends its session with a reason for
// the viewers, its shell is hung up, and its stale socket is removed.
func TestHolderKilledEndsSession(t *testing.T) {
	o := holderOptions(t, webterm.Options{})
	id := uniqueID(t)
	m, _ := newManager(t, o)
	v := open(t, m, webterm.OpenRequest{Session: id})
	out := collect(v)
	typeIn(t, v, "echo sh=$$ ok-$((4*4))\r")
	out.waitFor(t, "ok-16")
	sh := m.List()[0].PID
	hs := holders(id)
	if len(hs) != 1 {
		t.Fatalf("holders: %v", hs)
	}
	if err := syscall.Kill(hs[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e := out.end(t)
	if e.Code != webterm.CloseEnded || !strings.Contains(e.Reason, "holder") {
		t.Fatalf("viewer of a session whose holder died: %+v", e)
	}
	testutil.Eventually(t, wait, func() bool { return !alive(sh) }, "the shell outlived its holder")
	if _, err := os.Stat(filepath.Join(o.SessionDir, id+".sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale socket: %v", err)
	}
	if len(m.List()) != 0 {
		t.Fatalf("sessions: %+v", m.List())
	}
}

// TestHolderStaleSocketRemoved: a socket nobody listens on (a holder that died while klient
// was away) is removed by the next Manager; a socket directory others may enter is refused.
func TestHolderStaleSocketRemoved(t *testing.T) {
	o := holderOptions(t, webterm.Options{})
	id := uniqueID(t)
	m1, mach := newManager(t, o)
	o.Owner, o.Root, o.Logger = "alice", mach.Root, testutil.Logger(t)
	v := open(t, m1, webterm.OpenRequest{Session: id})
	out := collect(v)
	typeIn(t, v, "echo x-$((2*21))\r")
	out.waitFor(t, "x-42")
	hs := holders(id)
	if len(hs) != 1 {
		t.Fatalf("holders: %v", hs)
	}
	m1.Detach()
	syscall.Kill(hs[0], syscall.SIGKILL)
	testutil.Eventually(t, wait, func() bool { return !alive(hs[0]) }, "holder did not die")
	m2, err := webterm.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m2.Close)
	if ls := m2.List(); len(ls) != 0 {
		t.Fatalf("restored a dead holder's session: %+v", ls)
	}
	if _, err := os.Stat(filepath.Join(o.SessionDir, id+".sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale socket left: %v", err)
	}
	if fi, err := os.Stat(o.SessionDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("session dir: %v %v", fi.Mode(), err)
	}
}

// TestHolderRefusesOtherUsers: even where the socket directory's modes would let another user
// reach a holder's socket, the holder hangs up on a peer that is neither root nor its own uid
// (SO_PEERCRED), before saying anything.
func TestHolderRefusesOtherUsers(t *testing.T) {
	testutil.RequireRoot(t)
	o := holderOptions(t, webterm.Options{})
	id := uniqueID(t)
	m, _ := newManager(t, o)
	v := open(t, m, webterm.OpenRequest{Session: id})
	out := collect(v)
	typeIn(t, v, "echo secret-$((8*8))\r")
	out.waitFor(t, "secret-64")
	sock := filepath.Join(o.SessionDir, id+".sock")
	// Open the way for the intruder: the directory and the socket world-accessible.
	opened := map[string]os.FileMode{sock: 0o666}
	for d := o.SessionDir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) { // up to the test's temp dir
		opened[d] = 0o755
	}
	for path, mode := range opened {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
	dial := func(uid uint32) string {
		cmd := exec.Command("/proc/self/exe", "-test.run=^$")
		cmd.Env = append(os.Environ(), "WEBTERM_TEST_DIAL="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("intruder as uid %d: %v: %s", uid, err, b)
		}
		return strings.TrimSpace(string(b))
	}
	if got := dial(webtermtest.TestUID + 1); !strings.HasPrefix(got, "read 0 bytes: EOF") {
		t.Fatalf("a peer of another uid got: %q, want a hang-up", got)
	}
	// The session is untouched and klient still talks to its holder.
	typeIn(t, v, "echo still-$((9*9))\r")
	out.waitFor(t, "still-81")
}

// TestHolderOrphanTimeout: a holder no klient connects to again ends its shell after the idle
// timeout (what klient does to a session without viewers, which it cannot while it is gone) and
// exits: a klient that never comes back leaves nothing running.
func TestHolderOrphanTimeout(t *testing.T) {
	o := holderOptions(t, webterm.Options{IdleTimeout: 300 * time.Millisecond, KillGrace: 300 * time.Millisecond})
	id := uniqueID(t)
	m, _ := newManager(t, o)
	v := open(t, m, webterm.OpenRequest{Session: id})
	out := collect(v)
	typeIn(t, v, "trap '' HUP; echo sh=$$ ready-$((5*5))\r") // a shell that ignores the hangup: SIGKILL
	out.waitFor(t, "ready-25")
	sh := m.List()[0].PID
	hs := holders(id)
	if len(hs) != 1 {
		t.Fatalf("holders: %v", hs)
	}
	m.Detach()
	testutil.Eventually(t, wait, func() bool { return !alive(sh) && len(holders(id)) == 0 },
		"a holder without klient: shell alive %v, holders %v", alive(sh), holders(id))
	if ents, _ := os.ReadDir(o.SessionDir); len(ents) != 0 {
		t.Fatalf("left in the session dir: %v", ents)
	}
}

// TestHolderKillRunAsAfterRestart: sessions a new Manager restored from their holders are ended
// by KillRunAs (a revoked share) like any other: viewers told why, holders and shells gone.
func TestHolderKillRunAsAfterRestart(t *testing.T) {
	o := holderOptions(t, webterm.Options{})
	a, b := uniqueID(t), uniqueID(t)
	m1, mach := newManager(t, o)
	o.Owner, o.Root, o.Logger = "alice", mach.Root, testutil.Logger(t)
	var shells []int
	for _, id := range []string{a, b} {
		v := open(t, m1, webterm.OpenRequest{Session: id})
		out := collect(v)
		typeIn(t, v, "echo up-$((1+1))\r")
		out.waitFor(t, "up-2")
		in, err := m1.Info(id)
		if err != nil {
			t.Fatal(err)
		}
		shells = append(shells, in.PID)
	}
	m1.Detach()
	m2, err := webterm.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m2.Close)
	v := open(t, m2, webterm.OpenRequest{Session: a})
	out := collect(v)
	if n := m2.KillRunAs("alice", "revoked"); n != 2 {
		t.Fatalf("KillRunAs ended %d sessions, want 2", n)
	}
	if e := out.end(t); e.Code != webterm.CloseEnded || e.Reason != "revoked" {
		t.Fatalf("viewer: %+v", e)
	}
	testutil.Eventually(t, wait, func() bool {
		return len(holders(a))+len(holders(b)) == 0 && !alive(shells[0]) && !alive(shells[1])
	}, "after KillRunAs: holders %v %v, shells alive %v %v", holders(a), holders(b), alive(shells[0]), alive(shells[1]))
	if ls := m2.List(); len(ls) != 0 {
		t.Fatalf("sessions left: %+v", ls)
	}
}
