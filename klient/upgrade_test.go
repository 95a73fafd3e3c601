package klient_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
)

func (e *env) download(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	b := e.dl
	e.mu.Unlock()
	if b == nil {
		http.Error(w, "no klient here", http.StatusNotFound)
		return
	}
	w.Write(b)
}

func (e *env) serve(b []byte) {
	e.mu.Lock()
	e.dl = b
	e.mu.Unlock()
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sum(b)
}

// startProcess runs the klient binary bin as a process (its terminal sessions in holders under
// sessions) and waits until it registered with a connection other than the one before.
func (e *env) startProcess(bin, sessions string) *os.Process {
	e.t.Helper()
	before := e.ko.Kontrol.Conn(e.kiteID)
	cmd := testutil.StartProcess(e.t, bin, "--kite-key", e.keyFile, "--kontrol-url", e.srv.URL+"/kite", "--root", e.mach.Root,
		"--state-dir", e.stateDir, "--session-dir", sessions)
	e.waitRegistered(before)
	return cmd.Process
}

// waitRegistered waits for klient's registration on a connection other than before.
func (e *env) waitRegistered(before *kite.Conn) {
	e.t.Helper()
	testutil.Eventually(e.t, wait, func() bool {
		c := e.ko.Kontrol.Conn(e.kiteID)
		if c == nil || c == before {
			return false
		}
		e.conn = c
		return true
	}, "klient did not register (again)")
}

// TestUpgradeKeepsSessions drives the real klient binary: a shell with a background job lives
// in its holder through failed upgrades (no binary, a wrong checksum: klient untouched), a
// klient.upgrade (klient replaces its binary and re-executes itself: same pid) and a SIGTERM of
// klient with a new klient started after it: the same shell, its job, the replay, and typing.
func TestUpgradeKeepsSessions(t *testing.T) {
	testutil.RequireRoot(t) // holders run shells as the machine's owner account
	e := prepareEnv(t, true)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "klient")
	orig, err := os.ReadFile(testutil.BuildBinary(t, "./cmd/klient"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, orig, 0o755); err != nil {
		t.Fatal(err)
	}
	sessions := filepath.Join(dir, "sessions")
	proc := e.startProcess(bin, sessions)
	id := webtermtest.UniqueSession(t)

	l, _ := e.mustConnect("alice", webterm.ConnectParams{Session: id, Mode: webterm.ModeAttach})
	l.Type(t, "sleep 1000 & echo bg=$! sh=$$ mark-$((6*7))\r")
	l.WaitFor(t, "mark-42")
	m := regexp.MustCompile(`bg=(\d+) sh=(\d+)`).FindStringSubmatch(l.Output())
	if m == nil {
		t.Fatalf("no pids in %q", l.Output())
	}
	bg, _ := strconv.Atoi(m[1])
	sh, _ := strconv.Atoi(m[2])
	t.Cleanup(func() { syscall.Kill(bg, syscall.SIGKILL) })
	var info klientapi.Info
	if err := e.call(klientapi.MethodInfo, nil, &info); err != nil || info.SHA256 != sum(orig) {
		t.Fatalf("klient.info: sha256 %q, want %s (%v)", info.SHA256, sum(orig), err)
	}

	// Failures leave klient as it was.
	newBin := append(append([]byte{}, orig...), []byte("\nkloud upgrade test trailer\n")...) // still runs
	for _, c := range []struct {
		name  string
		serve []byte
		sum   string
		want  string
	}{
		{"no binary served", nil, sum(newBin), "404"},
		{"checksum mismatch", newBin, sum(orig), "sha256 mismatch"},
		{"not a program", []byte("#!/bin/false\n"), sum([]byte("#!/bin/false\n")), "does not run here"},
	} {
		e.serve(c.serve)
		err := e.call(klientapi.MethodUpgrade, klientapi.UpgradeParams{SHA256: c.sum}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: upgrade answered %v, want an error with %q", c.name, err, c.want)
		}
		if fileSum(t, bin) != sum(orig) {
			t.Fatalf("%s: the binary changed", c.name)
		}
	}
	if ents, _ := os.ReadDir(filepath.Dir(bin)); len(ents) != 1 {
		t.Fatalf("failed upgrades left files: %v", ents)
	}
	if err := e.call(klientapi.MethodUpgrade, map[string]string{"sha256": "nope"}, nil); err == nil {
		t.Fatal("an upgrade without a valid sha256 was accepted")
	}

	// The upgrade.
	e.serve(newBin)
	before := e.conn
	var res klientapi.UpgradeResult
	if err := e.call(klientapi.MethodUpgrade, klientapi.UpgradeParams{SHA256: sum(newBin)}, &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("upgrade: %+v", res)
	if res.OldSHA256 != sum(orig) || res.NewSHA256 != sum(newBin) || res.Sessions != 1 || res.NewVersion == "" {
		t.Fatalf("upgrade result %+v", res)
	}
	e.waitRegistered(before)
	if fileSum(t, bin) != sum(newBin) {
		t.Fatal("the binary was not replaced")
	}
	if err := e.call(klientapi.MethodInfo, nil, &info); err != nil || info.SHA256 != sum(newBin) {
		t.Fatalf("klient.info after the upgrade: sha256 %q, want %s (%v)", info.SHA256, sum(newBin), err)
	}
	if err := syscall.Kill(proc.Pid, 0); err != nil {
		t.Fatalf("klient's pid %d is gone after the upgrade (it should exec in place): %v", proc.Pid, err)
	}
	reattach := func(what string) {
		t.Helper()
		l, res := e.mustConnect("alice", webterm.ConnectParams{Session: id})
		if res.Created {
			t.Fatalf("after %s: a new session", what)
		}
		l.WaitFor(t, "mark-42") // the replay
		l.Type(t, "jobs; echo again-$$-$((3*3))\r")
		l.WaitFor(t, "again-"+strconv.Itoa(sh)+"-9")
		l.WaitFor(t, "sleep 1000")
		if syscall.Kill(bg, 0) != nil {
			t.Fatalf("after %s: the background job is gone", what)
		}
	}
	reattach("the upgrade")

	// SIGTERM: klient goes, its supervisor starts it again (here: the test).
	before = e.conn
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, func() bool { return webtermtest.Zombie(proc.Pid) }, "klient did not exit on SIGTERM")
	if len(webtermtest.Holders(id)) != 1 {
		t.Fatalf("holders after klient's exit: %v", webtermtest.Holders(id))
	}
	proc = e.startProcess(bin, sessions)
	reattach("SIGTERM and a new klient")
	// The new klient's activity counts the shell and its job, though its holder is no child of it.
	var act klientapi.Activity
	if err := e.call(klientapi.MethodActivity, nil, &act); err != nil || act.Processes < 2 {
		t.Fatalf("klient.activity after a restart: %+v (%v), want the shell and its job counted", act, err)
	}

	// Killing the session ends its holder: nothing is left.
	if err := e.call("webterm.kill", webterm.SessionParams{Session: id, Token: e.token("alice")}, nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, func() bool { return len(webtermtest.Holders(id)) == 0 && webtermtest.Zombie(sh) },
		"after webterm.kill: holders %v, shell alive %v", webtermtest.Holders(id), !webtermtest.Zombie(sh))
}
