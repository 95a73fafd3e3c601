// Package webtermtest sets up a machine root for web terminal tests: an /etc/passwd whose owner
// account has a fresh home and a shell that is bash without rc files (a stable prompt), run as
// a test uid when the tests run as root (so tests see the shell really run as the owner) and as
// the current user otherwise.
package webtermtest

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestUID is the uid (and gid) of the owner account when tests run as root.
const TestUID = 4242

// Machine is a machine root with an owner account.
type Machine struct {
	Root  string // pass as Options.Root
	Owner string
	UID   int
	Home  string
	Shell string // the wrapper that execs bash --norc --noprofile -i
}

// New makes a machine root for owner (a world-readable temp dir, removed when the test ends).
func New(t testing.TB, owner string) *Machine {
	t.Helper()
	dir := tempDir(t)
	return At(t, filepath.Join(dir, "root"), owner)
}

// At gives the machine rooted at root (an existing directory, e.g. a dummy provider machine's)
// an /etc/passwd with an account for owner, whose home and shell live in a new temp dir.
func At(t testing.TB, root, owner string) *Machine {
	t.Helper()
	dir := tempDir(t)
	m := &Machine{Root: root, Owner: owner, UID: TestUID, Home: filepath.Join(dir, "home", owner), Shell: filepath.Join(dir, "shell.sh")}
	for _, d := range []string{filepath.Join(m.Root, "etc"), m.Home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() != 0 {
		m.UID = os.Geteuid()
		if u, err := user.Current(); err == nil && u.Username != owner {
			t.Logf("not root: the shell runs as uid %d, and klient treats it as %s's", m.UID, owner)
		}
	} else if err := os.Chown(m.Home, TestUID, TestUID); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Shell, []byte("#!/bin/sh\nexec /bin/bash --norc --noprofile -i\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m.WritePasswd(t, fmt.Sprintf("%s:x:%d:%d:%s:%s:%s\n", owner, m.UID, m.UID, owner, m.Home, m.Shell))
	// What useradd --prefix needs to add shared users' accounts (klient's terminal shares).
	for name, content := range map[string]string{"etc/group": fmt.Sprintf("%s:x:%d:\n", owner, m.UID), "etc/shadow": "", "etc/gshadow": ""} {
		if err := os.WriteFile(filepath.Join(m.Root, name), []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(m.Root, "home"), 0o755); err != nil {
		t.Fatal(err)
	}
	return m
}

// Account returns the uid, home and GECOS of name in the machine's /etc/passwd (ok false if it
// has none).
func (m *Machine) Account(t testing.TB, name string) (uid int, home, gecos string, ok bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.Root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Split(l, ":")
		if len(f) >= 7 && f[0] == name {
			uid, _ = strconv.Atoi(f[2])
			return uid, f[5], f[4], true
		}
	}
	return 0, "", "", false
}

// tempDir makes a temp dir others may enter (the shell runs as another uid), removed when the
// test ends.
func tempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "webterm-machine-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// WritePasswd replaces the machine's /etc/passwd.
func (m *Machine) WritePasswd(t testing.TB, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.Root, "etc/passwd"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Holders lists the live session holders (`klient session-hold ID`, any binary) of session id:
// tests use unique ids, count what is left and kill it by pid.
func Holders(id string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) == 3 && args[1] == "session-hold" && args[2] == id && !Zombie(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// Zombie reports whether pid is gone or a zombie (dead, not yet reaped).
func Zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && len(b) > i+2 && b[i+2] == 'Z'
}

// UniqueSession is a session id no other test uses; the holders of that session still alive
// when the test ends are killed (by pid).
func UniqueSession(t testing.TB) string {
	id := "t" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() {
		for _, pid := range Holders(id) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return id
}
