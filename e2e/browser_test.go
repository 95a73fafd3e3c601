package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// chromiumPath is the Debian package's browser (scripts/setup-browser.sh installs it).
const chromiumPath = "/usr/bin/chromium"

// TestBrowser drives the real Chromium through kloud's web UI (e2e/browser/ui.mjs, with
// playwright-core): a user with a password logs in through the form, adds a dummy credential
// from the provider's form, writes and plans a template, creates and builds a stack watching the
// progress bar and log, and sees the machine Running with its agent connected; in its terminal
// it types `echo hello-$((6*7))`, reads hello-42 from the xterm buffer, reloads and sees the
// session replayed; bob, with a read-only share, watches her session from a second browser,
// sees her typing and cannot type, and is cut off when she unshares. Then kloud is killed and restarted under the open page, which shows
// "reconnecting" and carries on. Screenshots are kept in $KLOUD_ARTIFACTS/browser (default
// e2e/artifacts/browser).
func TestBrowser(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		testutil.Unavailable(t, "test needs Chromium at %s (Debian packages chromium, chromium-driver: scripts/setup-browser.sh)", chromiumPath)
	}
	node := testutil.RequireBinary(t, "node")
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "e2e", "browser")
	if _, err := os.Stat(filepath.Join(script, "node_modules", "playwright-core", "package.json")); err != nil {
		testutil.Unavailable(t, "test needs e2e/browser/node_modules (scripts/setup-browser.sh runs npm ci there)")
	}
	artifacts := os.Getenv("KLOUD_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(root, "e2e", "artifacts")
	}
	out := filepath.Join(artifacts, "browser")
	os.RemoveAll(out)
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}

	e := newEnv(t)
	if code := httpStatus(t, e.url()+"/"); code != http.StatusOK {
		t.Fatalf("kloud serves no web UI at / (GET / = %d): kloud/cli/serve.go must call web.Register(s) after kloud.New", code)
	}
	pw := filepath.Join(t.TempDir(), "password")
	const password = "browser-pass-1"
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.run("user", "add", "alice", "--team", "default", "--password-file", pw)
	e.run("user", "add", "bob", "--team", "default", "--password-file", pw) // the read-only watcher

	// The terminal steps need kloud's terminal endpoint (kloud/terminal.go): without a session
	// it answers 401; a 404 means this kloud has none.
	terminal := httpStatus(t, e.url()+"/api/machines/none/sessions") != http.StatusNotFound
	if !terminal {
		t.Log("NOTE: this kloud has no terminal endpoint (GET /api/machines/{id}/sessions is 404): terminal steps skipped")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "ui.mjs")
	cmd.Dir = script
	cmd.Env = append(os.Environ(), "KLOUD_URL="+e.url(), "KLOUD_USER=alice", "KLOUD_PASSWORD="+password,
		"KLOUD_SHARE_USER=bob", "KLOUD_SHARE_PASSWORD="+password, "KLOUD_ARTIFACTS="+out, "KLOUD_CHROMIUM="+chromiumPath, "KLOUD_RESTART=1", "KLOUD_TERMINAL="+map[bool]string{true: "1", false: "0"}[terminal])
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	final := drive(t, e, stdout, stdin)
	err = cmd.Wait()
	t.Logf("browser run: %s; screenshots in %s", time.Since(start).Round(time.Millisecond), out)
	if err != nil || !final.OK {
		t.Fatalf("browser test failed (%v); see the steps above and %s/failure.png\nstderr:\n%s", err, out, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(out, "machines.png")); err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
}

// uiLine is one line of ui.mjs's output.
type uiLine struct {
	Step  string `json:"step"`
	OK    bool   `json:"ok"`
	Need  string `json:"need"`
	Error string `json:"error"`
	Steps int    `json:"steps"`
}

// drive logs the script's steps and does what it asks for (kill or start kloud); it returns the
// final line.
func drive(t *testing.T, e *env, stdout io.Reader, stdin io.WriteCloser) uiLine {
	t.Helper()
	defer stdin.Close()
	var final uiLine
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		t.Log(line)
		var l uiLine
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		switch l.Need {
		case "kill":
			e.kill()
			io.WriteString(stdin, "done\n")
		case "start":
			e.start()
			io.WriteString(stdin, "done\n")
		case "":
			if l.Step == "" && l.Steps > 0 {
				final = l
			}
		default:
			t.Errorf("ui.mjs asked for %q", l.Need)
			io.WriteString(stdin, "unknown\n")
		}
	}
	return final
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}
