package e2e

// Shells that outlive klient (issue 22, Deliver 3) on a real local machine: a shell with a
// background job lives in its holder process through a SIGTERM of klient (the machine's restart
// loop starts it again), `kloud machine upgrade-agent` (kloud serves a new klient: the agent
// replaces itself, same pid) and a rollout (kloud restarted with a newer klient upgrades the
// agent by itself): same shell pid, replay intact, typing works. Killing the holder ends the
// session with a reason; nothing is left after the stack is destroyed. Needs root and the base
// image (skips loudly otherwise, fails under CI=true).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/klient/webterm/webtermtest"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/userdata"
)

func TestLocalShellsOutliveKlient(t *testing.T) {
	parallel(t)
	// kloud serves a copy of klient that the test replaces with newer ones (a trailer appended:
	// another sha256, the same program).
	klientCopy := filepath.Join(t.TempDir(), "klient")
	orig, err := os.ReadFile(filepath.Join(bin, "klient"))
	if err != nil {
		t.Fatal(err)
	}
	serve := func(b []byte) string {
		t.Helper()
		if err := os.WriteFile(klientCopy+".tmp", b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(klientCopy+".tmp", klientCopy); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	sum0 := serve(orig)
	e := newLocalEnv(t, "--klient-bin", klientCopy, "--agent-rollout", "off")
	e.alice()
	aliceKey := e.key
	sid := e.createStack(e.template(localTemplate("dev", 1, "#!/bin/bash\ntrue")))
	e.apply(sid)
	m := e.machines(sid)["dev.0"]
	if m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("dev.0 after apply: %+v", m)
	}
	id := m.sandboxID()
	t.Cleanup(func() {
		if t.Failed() {
			out, err := e.h.Manager.Exec(context.Background(), id, "tail", "-n", "80", userdata.KlientLogPath)
			t.Logf("%s in the machine (%v):\n%s", userdata.KlientLogPath, err, out)
		}
	})
	installed := func() string {
		t.Helper()
		return strings.Fields(e.exec(id, "sha256sum", userdata.KlientPath) + " none")[0]
	}
	if got := installed(); got != sum0 {
		t.Fatalf("installed klient %s, kloud serves %s", got, sum0)
	}
	klientPID := func() string { // the agent, not its holders (which run `klient session-hold`)
		t.Helper()
		return e.exec(id, "sh", "-c", "pgrep -f -- '--kite-ke[y]' || true")
	}

	term := e.terminal(t, aliceKey, m.ID, "session=keep")
	term.Type(t, "sleep 1000 & echo bg=$! sh=$$ mark-$((6*7))\r")
	term.WaitFor(t, "mark-42")
	pids := regexp.MustCompile(`bg=(\d+) sh=(\d+)`).FindStringSubmatch(term.Output())
	if pids == nil {
		t.Fatalf("no pids in %q", term.Output())
	}
	bg, sh := pids[1], pids[2]
	alive := func(pid string) bool {
		return e.exec(id, "sh", "-c", "kill -0 "+pid+" 2>/dev/null && echo yes || echo no") == "yes"
	}
	// reattach opens the session again (retrying while the agent reconnects): the same shell,
	// its background job, the replay, and typing.
	reattach := func(after string, start time.Time) {
		t.Helper()
		var l *webtermtest.Term
		var last string
		testutil.Eventually(t, 2*time.Minute, func() bool {
			ws, resp, err := e.dialTerminal(t, aliceKey, m.ID, "session=keep&mode=shared")
			if err != nil {
				last = status(resp) + ": " + err.Error()
				return false
			}
			c := webtermtest.NewTerm(ws)
			for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && c.Open() && !strings.Contains(c.Output(), "mark-42"); {
				time.Sleep(20 * time.Millisecond)
			}
			if strings.Contains(c.Output(), "mark-42") { // the replay
				l = c
				t.Cleanup(func() { ws.CloseNow() })
				return true
			}
			if c.Open() {
				last = "no replay within 15 s: " + c.Output()
			} else {
				last = fmt.Sprintf("closed %+v", c.Closed(t))
			}
			ws.CloseNow()
			t.Logf("after %s: reattaching: %s; again", after, last)
			return false
		}, "after %s: the session cannot be reattached: %s", after, last)
		l.Type(t, "jobs; echo again-$$-$((3*3))\r")
		l.WaitFor(t, "again-"+sh+"-9")
		l.WaitFor(t, "sleep 1000")
		if !alive(bg) {
			t.Fatalf("after %s: the background job %s is gone", after, bg)
		}
		t.Logf("after %s: the same shell (pid %s) reopened, replayed and answered %s after it began", after, sh, time.Since(start).Round(time.Millisecond))
	}

	// `kloud ssh` attached to the same session attaches again by itself after each restart.
	cli := exec.Command(filepath.Join(bin, "kloud"), "ssh", m.ID, "--session", "keep", "--mode", "shared")
	cli.Env = append(os.Environ(), "KLOUD_URL="+e.url(), "KLOUD_DATA_DIR="+e.dir, "KLOUD_KEY="+aliceKey)
	var cliOut testutil.SyncBuffer
	cli.Stdout, cli.Stderr = &cliOut, &cliOut
	cliIn, err := cli.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Process.Kill(); cli.Wait() })
	testutil.Eventually(t, time.Minute, func() bool { return strings.Contains(cliOut.String(), "mark-42") }, "kloud ssh got no replay")

	// 1. SIGTERM of klient: the machine's restart loop starts a new one, which finds the holder.
	old := klientPID()
	if old == "" || strings.Contains(old, "\n") {
		t.Fatalf("klient's pid in the machine: %q", old)
	}
	killed := time.Now()
	e.exec(id, "kill", "-TERM", old)
	testutil.Eventually(t, time.Minute, func() bool { p := klientPID(); return p != "" && p != old }, "klient was not restarted")
	if c := term.Closed(t); c.Code == webterm.CloseEnded {
		t.Fatalf("the viewer was told the session ended (the UI would not reconnect): %+v", c)
	}
	reattach("kill -TERM of klient (the restart loop waits 2 s)", killed)
	cliIn.Write([]byte("echo cli-$((5*5))\n"))
	testutil.Eventually(t, time.Minute, func() bool {
		o := cliOut.String()
		return strings.Contains(o, "reattached to session keep") && strings.Contains(o, "cli-25")
	}, "kloud ssh did not attach again after klient's restart:\n%s", &cliOut)
	t.Logf("kloud ssh attached again by itself: %q", regexp.MustCompile(`\[kloud: [^\]]*\]`).FindAllString(cliOut.String(), -1))

	// 2. kloud machine upgrade-agent, with kloud serving a newer klient (a restart of kloud reads it).
	sum1 := serve(append(append([]byte{}, orig...), "\nkloud e2e upgrade 1\n"...))
	e.kill()
	e.start()
	pid := klientPID()
	var res api.UpgradeAgentResult
	var upgraded time.Time
	testutil.Eventually(t, 2*time.Minute, func() bool {
		upgraded = time.Now()
		out, err := e.try("machine", "upgrade-agent", "dev.0", "--stack", sid, "--json")
		if err != nil {
			t.Logf("upgrade-agent: %s", out)
			return false
		}
		return json.Unmarshal([]byte(out), &res) == nil
	}, "kloud machine upgrade-agent did not succeed")
	t.Logf("upgrade-agent took %s: %+v", time.Since(upgraded).Round(time.Millisecond), res)
	if !res.Upgraded || res.OldSHA256 != sum0 || res.NewSHA256 != sum1 || res.Sessions != 1 {
		t.Fatalf("upgrade-agent: %+v, want an upgrade from %s to %s with 1 session", res, sum0, sum1)
	}
	if got := installed(); got != sum1 {
		t.Fatalf("installed klient after upgrade-agent: %s, want %s", got, sum1)
	}
	if p := klientPID(); p != pid {
		t.Errorf("klient's pid went from %s to %s: the upgrade should exec in place", pid, p)
	}
	reattach("kloud machine upgrade-agent", upgraded)
	if out := e.run("machine", "upgrade-agent", "dev.0", "--stack", sid); !strings.Contains(out, "already runs") {
		t.Errorf("a second upgrade-agent: %s", out)
	}
	// Another member may not upgrade alice's machine's agent.
	e.key = ""
	e.run("user", "add", "bob", "--team", "default")
	bobKey := filepath.Join(e.dir, "bob.key")
	e.run("key", "create", "--username", "bob", "--out", bobKey)
	e.key = bobKey
	if out, err := e.try("machine", "upgrade-agent", m.ID); err == nil {
		t.Errorf("bob upgraded alice's machine's agent: %s", out)
	}
	e.key = aliceKey

	// 3. The rollout: kloud restarted with a newer klient and --agent-rollout=auto upgrades it.
	sum2 := serve(append(append([]byte{}, orig...), "\nkloud e2e upgrade 2\n"...))
	for i, a := range e.extra {
		if a == "--agent-rollout" {
			e.extra[i+1] = "auto"
		}
	}
	e.kill()
	restarted := time.Now()
	e.start()
	testutil.Eventually(t, 3*time.Minute, func() bool { return strings.Contains(e.kloudOut.String(), "agent rollout: upgraded") },
		"the rollout did not upgrade the agent")
	if got := installed(); got != sum2 {
		t.Fatalf("installed klient after the rollout: %s, want %s", got, sum2)
	}
	reattach("the rollout (kloud restarted)", restarted)

	// 4. Killing the holder ends the session, with a reason for its viewers.
	l := e.terminal(t, aliceKey, m.ID, "session=keep&mode=shared")
	l.WaitFor(t, "mark-42")
	holder := e.exec(id, "sh", "-c", "pgrep -f -- 'session-hol[d] keep' || true")
	if holder == "" || strings.Contains(holder, "\n") {
		t.Fatalf("the holder's pid in the machine: %q", holder)
	}
	e.exec(id, "kill", "-KILL", holder)
	if c := l.Closed(t); c.Code != webterm.CloseEnded || !strings.Contains(c.Reason, "holder") {
		t.Errorf("viewer of a session whose holder was killed: %+v", c)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return !alive(sh) }, "the shell outlived its holder")

	infos := e.sandboxInfos()
	e.run("stack", "destroy", sid)
	e.assertNothingLeft(infos)
}
