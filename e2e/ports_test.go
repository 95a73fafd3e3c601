package e2e

// Ports (issue 13 §5) on real local machines: the firewall keeps another user's machine off a
// port the owner's other machine reaches, until the owner opens it; a web server in a machine
// (python3 -m http.server) opens in Chromium through kloud, on its own origin, for its owner and
// a user it is shared with, not for another user; `kloud port-forward` carries TCP to it. Needs
// root, the base image, Chromium and e2e/browser/node_modules (skips loudly otherwise, fails
// under CI=true).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

func TestLocalPorts(t *testing.T) {
	node, script, _ := browserPrereqs(t)
	e := newLocalEnv(t)
	password := "ports-pass-1"
	keys := e.members(password, "alice", "bob", "carol")
	marker := "kloud-ports-" + randomWord()
	// The server must not hold the script's output open (kloud waits for the script's end).
	serve := "#!/bin/bash\nmkdir -p /srv/www && echo " + marker + " > /srv/www/index.html\n" +
		"setsid python3 -m http.server 8000 --directory /srv/www >/dev/null 2>&1 < /dev/null &"
	e.key = keys["alice"]
	tid := e.template(localTemplate("web", 2, serve))
	sid := e.createStack(tid)
	e.apply(sid)
	e.key = keys["carol"]
	csid := e.createStack(tid)
	e.apply(csid)
	carol := e.machines(csid)
	e.key = keys["alice"]
	alice := e.machines(sid)
	if alice["web.0"].IPAddress == "" || alice["web.1"].IPAddress == "" || carol["web.0"].IPAddress == "" {
		t.Fatalf("machines: alice's %+v, carol's %+v", alice, carol)
	}
	web0, web1, other := alice["web.0"], alice["web.1"], carol["web.0"]
	url := "http://" + web0.IPAddress + ":8000/index.html"
	reach := func(from machine) bool {
		out, err := e.h.Manager.Exec(t.Context(), from.sandboxID(), "curl", "-s", "--noproxy", "*", "-m", "3", url)
		return err == nil && strings.Contains(string(out), marker)
	}

	// The firewall: the owner's machine reaches web.0:8000, carol's does not until alice opens it.
	diag := func() string {
		out, _ := e.h.Manager.Exec(t.Context(), web0.sandboxID(), "sh", "-c", "pgrep -a python3; cat /var/log/kloud/user-script.log; ip -4 addr show eth0")
		out2, _ := e.h.Manager.Exec(t.Context(), web1.sandboxID(), "sh", "-c", "curl -sv --noproxy '*' -m 3 "+url+" 2>&1 | tail -5")
		return string(out) + "\nfrom web.1:\n" + string(out2)
	}
	for deadline := time.Now().Add(time.Minute); !reach(web1); time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("alice's web.1 cannot reach web.0:8000 (%s):\n%s", url, diag())
		}
	}
	if reach(other) {
		t.Fatal("carol's machine reaches alice's web.0:8000 with no rule")
	}
	e.key = keys["alice"]
	e.run("machine", "ports", "open", "web.0", "8000", "--from", "any", "--stack", sid)
	if out := e.run("machine", "ports", "web.0", "--stack", sid); !strings.Contains(out, "8000") || !strings.Contains(out, "any") {
		t.Errorf("machine ports after open:\n%s", out)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return reach(other) }, "carol's machine cannot reach an open port")
	e.run("machine", "ports", "close", "web.0", "8000", "--from", "any", "--stack", sid)
	if reach(other) {
		t.Error("carol's machine reaches web.0:8000 after the rule was closed")
	}
	e.key = keys["carol"]
	if out, err := e.try("machine", "ports", "open", web0.ID, "8000"); err == nil {
		t.Errorf("carol opened a port of alice's machine:\n%s", out)
	}

	// The browser: alice and bob (a terminal share) see the app on its own origin; carol does not.
	e.key = keys["alice"]
	e.run("machine", "share", "web.0", "bob", "--grant", "terminal", "--stack", sid)
	users, _ := json.Marshal([]map[string]string{
		{"name": "alice", "password": password, "want": "ok"},
		{"name": "bob", "password": password, "want": "ok"},
		{"name": "carol", "password": password, "want": "refused"},
	})
	unlock := lockBrowser(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := browserCommand(ctx, node, "ports.mjs")
	cmd.Dir = script
	cmd.Env = append(os.Environ(), "KLOUD_URL="+e.url(), "KLOUD_CHROMIUM="+chromiumPath, "KLOUD_MARKER="+marker,
		"KLOUD_OPEN_URL="+fmt.Sprintf("%s/api/machines/%s/ports/8000/open", e.url(), web0.ID),
		"KLOUD_APPS_IP="+e.h.HostAddr().String(), "KLOUD_USERS="+string(users), "KLOUD_MACHINE_ID="+web0.ID, "KLOUD_OWNER=alice")
	out, err := cmd.CombinedOutput()
	unlock()
	t.Logf("ports.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the browser steps failed: %v", err)
	}

	// kloud port-forward: a local port whose connections reach web.0:8000.
	pf := exec.CommandContext(t.Context(), filepath.Join(bin, "kloud"), "port-forward", web0.ID, "0:8000")
	pf.Env = append(os.Environ(), "KLOUD_URL="+e.url(), "KLOUD_KEY="+keys["bob"])
	stdout, _ := pf.StdoutPipe()
	pf.Stderr = pf.Stdout
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pf.Process.Kill(); pf.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	local, _, ok := strings.Cut(strings.TrimPrefix(line, "Forwarding "), " -> ")
	if err != nil || !ok {
		t.Fatalf("port-forward said %q (%v)", line, err)
	}
	go io.Copy(io.Discard, stdout)
	resp, err := http.Get("http://" + local + "/index.html")
	if err != nil {
		t.Fatalf("through port-forward: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), marker) {
		t.Fatalf("through port-forward: %s %q", resp.Status, body)
	}
	pf.Process.Kill()

	e.run("stack", "destroy", sid)
	e.key = keys["carol"]
	e.run("stack", "destroy", csid)
}
