package e2e

// An agent key is an agent, nothing else (issue 9, item 4), on a real local machine: the key
// cloud-init wrote to /etc/kloud/kite.key is an agent key (its own kind, sub naming the machine)
// that kloud refuses as a user key, and a user the machine is shared with gets, per grant, the
// shell the grant promises, opened through kloud's terminal endpoint with the user's own key:
// readonly watches and cannot type; terminal is a shell as their own account, which cannot read
// the key and cannot sudo; full is the owner's account. Needs root and the base image (skips
// loudly otherwise, fails under CI=true).

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
)

func TestLocalAgentKeyAndSharedShells(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	aliceKey := e.key
	sid := e.createStack(e.template(localTemplate("dev", 1, "#!/bin/bash\ntrue")))
	e.apply(sid)
	m := e.machines(sid)["dev.0"]
	if m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("dev.0 after apply: %+v", m)
	}
	id := m.sandboxID()

	// The machine's key: root-only, an agent key for this machine of alice's.
	if got := e.exec(id, "stat", "-c", "%a %U %G", "/etc/kloud/kite.key"); got != "400 root root" {
		t.Errorf("/etc/kloud/kite.key is %q, want 400 root root", got)
	}
	key := e.exec(id, "cat", "/etc/kloud/kite.key")
	kf, err := kitekey.ParseKeyFile(key)
	if err != nil {
		t.Fatal(err)
	}
	if kf.Kind != kitekey.KindAgentKey || kf.Subject != kitekey.MachineSubject(m.ID) || kf.Owner != "alice" || kf.KiteID != m.KiteID {
		t.Fatalf("the machine's key: %+v (machine %s, kite %s)", kf, m.ID, m.KiteID)
	}

	// Bug 3's exploit: the key read from the machine is no user key.
	keyFile := filepath.Join(t.TempDir(), "kite.key")
	if err := os.WriteFile(keyFile, []byte(key), 0o400); err != nil {
		t.Fatal(err)
	}
	e.key = keyFile
	out := filepath.Join(t.TempDir(), "a.key")
	for _, args := range [][]string{{"key", "create", "--username", "admin", "--out", out}, {"whoami"}, {"kites"}, {"machine", "list"}} {
		msg, err := e.try(args...)
		if err == nil || !strings.Contains(msg, "agent keys may only register their own agent") {
			t.Errorf("kloud --key kite.key %s: %v\n%s", strings.Join(args, " "), err, msg)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("key create with the machine's key wrote a key")
	}

	// bob, with a key of his own.
	e.key = ""
	e.run("user", "add", "bob", "--team", "default")
	bobKey := filepath.Join(e.dir, "bob.key")
	e.run("key", "create", "--username", "bob", "--out", bobKey)
	e.key = aliceKey
	share := func(grant string) {
		e.key = aliceKey
		e.run("machine", "share", "dev.0", "bob", "--grant", grant, "--stack", sid)
	}
	// A signature part of the key: no file bob can read may hold it.
	sig := key[strings.LastIndex(key, ".")+1:]

	owner := e.terminal(t, aliceKey, m.ID, "session=owner-s")
	owner.Type(t, "echo OWNER=$(id -un)\r")
	owner.WaitFor(t, "OWNER=alice")

	t.Run("readonly", func(t *testing.T) {
		share("readonly")
		if code := e.terminalStatus(t, bobKey, m.ID, "mode=create"); code != http.StatusForbidden {
			t.Errorf("readonly share opening a shell: HTTP %d, want 403", code)
		}
		bob := e.terminal(t, bobKey, m.ID, "session=owner-s&mode=readonly")
		bob.Type(t, "echo BOB=$((3+4))\r")
		owner.Type(t, "echo ALICE=$((5+6))\r")
		bob.WaitFor(t, "ALICE=11")
		owner.Type(t, "echo AFTER=$((6+6))\r")
		owner.WaitFor(t, "AFTER=12")
		if strings.Contains(owner.Output(), "BOB=7") {
			t.Error("a readonly share's typing ran in the owner's shell")
		}
	})

	t.Run("terminal", func(t *testing.T) {
		share("terminal")
		bob := e.terminal(t, bobKey, m.ID, "mode=create")
		bob.Type(t, "echo USER=$(id -un) GROUPS=$(id -Gn | tr ' ' ,) HOME=$HOME\r")
		bob.WaitFor(t, "USER=bob GROUPS=bob HOME=/home/bob")
		bob.Type(t, "cat /etc/kloud/kite.key; echo CAT=$?\r")
		bob.WaitFor(t, "CAT=1")
		bob.Type(t, "sudo -n true; echo SUDO=$?\r")
		bob.WaitFor(t, "SUDO=1")
		bob.Type(t, "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo BG=$((7*7))\r") // left behind: unshare ends it
		bob.WaitFor(t, "BG=49")
		bob.Type(t, "grep -rlsF -e '"+sig+"' /etc /var /run /home /root /tmp /opt /srv 2>/dev/null | wc -l | sed 's/^/FOUND=/'\r")
		found := regexp.MustCompile(`FOUND=(\d+)`)
		testutil.Eventually(t, 2*time.Minute, func() bool { return found.MatchString(bob.Output()) }, "the search for the key did not finish:\n%s", tail(bob.Output()))
		o := bob.Output()
		if !strings.Contains(o, "Permission denied") || found.FindStringSubmatch(o)[1] != "0" {
			t.Errorf("bob's terminal shell reached the key:\n%s", tail(o))
		}
		// He may watch the owner's shell, not type into it.
		c := e.terminal(t, bobKey, m.ID, "session=owner-s&mode=shared").Closed(t)
		if c.Code != webterm.CloseRefused || !strings.Contains(c.Reason, "runs as") {
			t.Errorf("terminal share joining the owner's shell: %+v", c)
		}
		e.terminal(t, bobKey, m.ID, "session=owner-s&mode=readonly")
	})

	t.Run("full", func(t *testing.T) {
		share("full")
		bob := e.terminal(t, bobKey, m.ID, "mode=create")
		bob.Type(t, "echo USER=$(id -un); sudo -n true; echo SUDO=$?\r")
		bob.WaitFor(t, "USER=alice")
		bob.WaitFor(t, "SUDO=0")
	})

	// Unshare: nothing runs as bob's account any more, and it is expired.
	e.key = aliceKey
	if got := e.exec(id, "sh", "-c", "pgrep -u bob -x sleep >/dev/null; echo $?"); got != "0" {
		t.Fatalf("bob's background sleep is not running before unshare (pgrep: %s)", got)
	}
	e.run("machine", "unshare", "dev.0", "bob", "--stack", sid)
	testutil.Eventually(t, 30*time.Second, func() bool { return e.exec(id, "sh", "-c", "pgrep -u bob >/dev/null; echo $?") == "1" },
		"processes of bob's account after unshare: %s", e.exec(id, "sh", "-c", "ps -u bob -o pid,args || true"))
	if exp := e.exec(id, "sh", "-c", "getent shadow bob | cut -d: -f8"); exp == "" {
		t.Error("bob's account is not expired after unshare")
	}
	e.run("stack", "destroy", sid)
}

// terminal opens a terminal on machine id through kloud's endpoint with the key in keyFile as
// the bearer, and fails the test if kloud does not upgrade.
func (e *localEnv) terminal(t *testing.T, keyFile, id, query string) *webtermtest.Term {
	t.Helper()
	ws, resp, err := e.dialTerminal(t, keyFile, id, query)
	if err != nil {
		t.Fatalf("terminal %s as %s: %v (HTTP %v)", query, filepath.Base(keyFile), err, status(resp))
	}
	term := webtermtest.NewTerm(ws)
	t.Cleanup(func() { ws.CloseNow() })
	return term
}

// terminalStatus is the HTTP status of a terminal request (101 if it was upgraded).
func (e *localEnv) terminalStatus(t *testing.T, keyFile, id, query string) int {
	t.Helper()
	ws, resp, _ := e.dialTerminal(t, keyFile, id, query)
	if ws != nil {
		ws.CloseNow()
	}
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

func (e *localEnv) dialTerminal(t *testing.T, keyFile, id, query string) (*websocket.Conn, *http.Response, error) {
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	u := fmt.Sprintf("ws://%s/api/machines/%s/terminal?%s", e.addr, id, query)
	return websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(key))}}})
}

func status(r *http.Response) string {
	if r == nil {
		return "none"
	}
	return r.Status
}

func tail(s string) string {
	if len(s) > 3000 {
		return "..." + s[len(s)-3000:]
	}
	return s
}
