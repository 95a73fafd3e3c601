package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

// chromiumPath is the Debian package's browser (scripts/setup-browser.sh installs it).
const chromiumPath = "/usr/bin/chromium"

// browserPrereqs gates on Chromium, node and e2e/browser/node_modules, and returns node, the
// script's directory and a fresh artifacts directory for this test.
func browserPrereqs(t *testing.T) (node, script, out string) {
	t.Helper()
	// Browser tests run beside the package's other parallel tests, one Chromium at a time
	// (lockBrowser, held by runBrowserScript; sched_test.go): serial, they kept every parallel
	// test waiting for their 7 minutes.
	parallel(t)
	return browserTools(t)
}

// browserTools is browserPrereqs without parallel, for a sub-test of a test that holds its slot
// already (replicas_test.go).
func browserTools(t *testing.T) (node, script, out string) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		testutil.Unavailable(t, "test needs Chromium at %s (Debian packages chromium, chromium-driver: scripts/setup-browser.sh)", chromiumPath)
	}
	node = testutil.RequireBinary(t, "node")
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	script = filepath.Join(root, "e2e", "browser")
	if _, err := os.Stat(filepath.Join(script, "node_modules", "playwright-core", "package.json")); err != nil {
		testutil.Unavailable(t, "test needs e2e/browser/node_modules (scripts/setup-browser.sh runs npm ci there)")
	}
	artifacts := os.Getenv("KLOUD_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(root, "e2e", "artifacts")
	}
	out = filepath.Join(artifacts, t.Name())
	os.RemoveAll(out)
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return node, script, out
}

// browserUsers checks that kloud serves the UI and adds alice and bob with a password.
func browserUsers(t *testing.T, e *env) (password string) {
	t.Helper()
	if code := httpStatus(t, e.url()+"/"); code != http.StatusOK {
		t.Fatalf("kloud serves no web UI at / (GET / = %d): kloud/cli/serve.go must call web.Register(s) after kloud.New", code)
	}
	pw := filepath.Join(t.TempDir(), "password")
	password = "browser-pass-1"
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.run("user", "add", "alice", "--team", "default", "--password-file", pw)
	e.run("user", "add", "bob", "--team", "default", "--password-file", pw) // the read-only watcher
	e.run("user", "add", "ops", "--admin", "--password-file", pw)           // a kloud administrator (quota page)
	return password
}

// runUI runs ui.mjs against e with the given settings (KEY=VALUE) and fails the test unless
// every step passed; it kills and starts kloud when the script asks.
func runUI(t *testing.T, e *env, node, script, out string, settings ...string) {
	t.Helper()
	runBrowserScript(t, e, node, script, out, "ui.mjs", map[string]func() error{
		"kill":  func() error { e.kill(); return nil },
		"start": func() error { e.start(); return nil },
	}, settings...)
}

// browserCommand runs node with script under nice -n -10: the browser stands for a user's
// machine, and on a 2-core host running the whole suite (load 15 to 25) Chromium at the default
// priority got too little CPU to boot a page within a minute (a reloaded page stuck at
// "Loading…"). Without the privilege to raise its priority, nice says so and runs it anyway.
func browserCommand(ctx context.Context, node, script string) *exec.Cmd {
	return exec.CommandContext(ctx, "nice", "-n", "-10", node, script)
}

// runBrowserScript runs the script file (in e2e/browser) against e with the given settings
// (KEY=VALUE) and fails the test unless every step passed. When the script prints
// {"need": what}, needs[what] runs and its answer ("done", or its error) goes to the script's
// stdin.
func runBrowserScript(t *testing.T, e *env, node, script, out, file string, needs map[string]func() error, settings ...string) {
	t.Helper()
	// 20 minutes: TestBrowserUpdateSnapshot's script took over 10 on a loaded host (ci45: the
	// update it watches alone took 3).
	runBrowserScriptFor(t, 20*time.Minute, e, node, script, out, file, needs, settings...)
}

// runBrowserScriptFor is runBrowserScript with the script's time limit: TestNetworkCut's
// CHAOS_N=20 cuts alone take 30 minutes.
func runBrowserScriptFor(t *testing.T, limit time.Duration, e *env, node, script, out, file string, needs map[string]func() error, settings ...string) {
	t.Helper()
	unlock := lockBrowser(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := browserCommand(ctx, node, file)
	cmd.Dir = script
	// TMPDIR: the browser's profile and Playwright's artifacts go in a directory the test removes,
	// so that a script killed at its limit leaves nothing behind (make chaos of f89e2e6 left both
	// in /tmp). Not t.TempDir(): its name holds the test's, and Chromium does not start with a
	// profile path holding a comma (ci66, TestReplicas/browser_terminal_across_replicas,_…).
	tmp, err := os.MkdirTemp("", "kloud-browser-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	cmd.Env = append(append(os.Environ(), "KLOUD_URL="+e.url(), "KLOUD_USER=alice", "KLOUD_ARTIFACTS="+out, "KLOUD_CHROMIUM="+chromiumPath,
		"TMPDIR="+tmp), settings...)
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
	final := drive(t, stdout, stdin, needs)
	err = cmd.Wait()
	unlock()
	t.Logf("browser run: %s; screenshots in %s", time.Since(start).Round(time.Millisecond), out)
	if err != nil || !final.OK {
		t.Fatalf("browser test failed (%v); see the steps above and %s/failure.png\nstderr:\n%s", err, out, stderr.String())
	}
}

// TestBrowser drives the real Chromium through kloud's web UI (e2e/browser/ui.mjs, with
// playwright-core) with the dummy provider: alice logs in through the form, adds a credential
// from the provider's form, authenticates and bootstraps it, writes and plans a template,
// creates and builds a stack watching the progress bar and log, sees the machine Running with
// its agent connected and every page render, each showing titles and values rather than ids,
// JSON and raw errors (the docker provider, offered with no daemon behind it, is unavailable in
// one line); her quota page shows her quota (3 machines, set by the test) and her use, and an
// administrator raises it to 5 on the same page in a second browser; an administrator reads
// alice's logins and build on the Audit page and verifies the log's chain (alice has no Audit
// page); then kloud is killed and restarted under the open page, which shows
// "reconnecting" and carries on. Screenshots are kept in
// $KLOUD_ARTIFACTS/TestBrowser (default e2e/artifacts/TestBrowser).
func TestBrowser(t *testing.T) {
	node, script, out := browserPrereqs(t)
	// The docker provider with no daemon behind it, as on a host without Docker: the providers
	// page says so in a line.
	e := newEnv(t, "--docker-host", "unix://"+filepath.Join(t.TempDir(), "no-docker.sock"))
	password := browserUsers(t, e)
	e.run("quota", "set", "--user", "alice", "--machines", "3")
	// ops, a kloud administrator with a password, sets alice's quota and reads the audit log in
	// the UI (ui.mjs quotaSteps, auditSteps).
	runUI(t, e, node, script, out, "KLOUD_PASSWORD="+password, "KLOUD_RESTART=1", "KLOUD_TERMINAL=0", "KLOUD_UNAVAILABLE=docker",
		"KLOUD_QUOTA_ADMIN=ops", "KLOUD_QUOTA_ADMIN_PASSWORD="+password,
		"KLOUD_AUDIT_USER=ops", "KLOUD_AUDIT_PASSWORD="+password)
	if _, err := os.Stat(filepath.Join(out, "machines.png")); err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
}

// TestBrowserTerminal is the browser terminal into a local machine (namespaces, real
// cloud-init, the owner's account made by it): alice builds a one-machine stack in the UI,
// opens its terminal, types `echo hello-$((6*7))`, reads hello-42 from the xterm buffer,
// reloads and sees the session replayed; bob, with a read-only share, watches her session from
// a second browser, sees her typing and cannot type, and is cut off when she unshares; then
// kloud is killed and restarted, and the terminal tab reattaches. Screenshots in
// $KLOUD_ARTIFACTS/TestBrowserTerminal.
func TestBrowserTerminal(t *testing.T) {
	node, script, out := browserPrereqs(t)
	le := newLocalEnv(t)
	e := le.env
	password := browserUsers(t, e)
	// kloud's terminal endpoint (kloud/relay/terminal.go) answers 401 without a session.
	if code := httpStatus(t, e.url()+"/api/machines/none/sessions"); code != http.StatusUnauthorized {
		t.Fatalf("GET /api/machines/none/sessions without a session = %d, want 401 (kloud/relay/terminal.go)", code)
	}
	runUI(t, e, node, script, out, "KLOUD_PASSWORD="+password, "KLOUD_TERMINAL=1", "KLOUD_RESTART=1",
		"KLOUD_SHARE_USER=bob", "KLOUD_SHARE_PASSWORD="+password,
		"KLOUD_CREDENTIAL=0", "KLOUD_PROVIDER=local", "KLOUD_MACHINE=dev.0", "KLOUD_TAGS=tags",
		"KLOUD_TEMPLATE="+localTemplate("dev", 1, "#!/bin/bash\necho ready"))
	for _, f := range []string{"terminal.png", "terminal-after-reload.png", "readonly-watcher.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
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

// drive logs the script's steps and does what it asks for (needs); it returns the final line.
func drive(t *testing.T, stdout io.Reader, stdin io.WriteCloser, needs map[string]func() error) uiLine {
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
		if l.Need == "" {
			if l.Step == "" && l.Steps > 0 {
				final = l
			}
			continue
		}
		answer := "done"
		if f, ok := needs[l.Need]; !ok {
			t.Errorf("the browser script asked for %q", l.Need)
			answer = "unknown"
		} else if err := f(); err != nil {
			if errors.As(err, new(notYet)) {
				t.Logf("%s: %v (the script tries again)", l.Need, err)
			} else {
				t.Errorf("%s: %v", l.Need, err)
			}
			answer = strings.ReplaceAll(err.Error(), "\n", " ")
		}
		io.WriteString(stdin, answer+"\n")
	}
	return final
}

// notYet is a need's answer that is not a failure: the script acts on it and asks again (e.g.
// replicas.mjs reloads the page until the terminal lands on another replica).
type notYet string

func (n notYet) Error() string { return string(n) }

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

// TestBrowserPlugin is the example provider plugin (examples/provider-example) in the browser:
// installed with `kloud provider install` into a kloud that launches it sandboxed, it is listed
// on the providers page as a connected plugin with its capabilities; alice adds a credential
// through the form built from the schema the plugin sent, authenticates and bootstraps it,
// builds a stack of its machines, sees the machine Running with its agent connected and opens
// its terminal. Screenshots in $KLOUD_ARTIFACTS/TestBrowserPlugin.
func TestBrowserPlugin(t *testing.T) {
	node, script, out := browserPrereqs(t)
	e := newPluginEnv(t)
	password := browserUsers(t, e)
	e.run("provider", "install", testutil.BuildBinary(t, "./examples/provider-example"), "--name", "example", "--wait", "60s")
	runUI(t, e, node, script, out, "KLOUD_PASSWORD="+password, "KLOUD_TERMINAL=1", "KLOUD_PLUGIN=1",
		"KLOUD_PROVIDER=example", "KLOUD_MACHINE=vm.0", "KLOUD_PLUGIN_VERSION=0.1.0",
		`KLOUD_CRED_FIELDS={"label":"browser","maxMachines":2}`,
		`KLOUD_PLUGIN_FORM={"label":{"type":"text","required":true},"maxMachines":{"type":"number","min":"1","max":"16"}}`,
		"KLOUD_TEMPLATE="+`resource "terraform_data" "vm" {
  count = 1
  input = "#!/bin/bash\necho ready"
}
`)
	for _, f := range []string{"providers.png", "machines.png", "terminal.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
	}
}

// TestBrowserDocker is a docker machine in the browser (a private dockerd, dockertest): alice
// plans a template of one container and sees the attributes the template sets, the provider's
// defaults folded (must_run=true among them), builds the stack,
// sees the machine Running with its agent connected, and its page shows the container's
// attributes as values (lists and maps as rows, no JSON) under its stack's title.
// Screenshots in $KLOUD_ARTIFACTS/TestBrowserDocker.
func TestBrowserDocker(t *testing.T) {
	node, script, out := browserPrereqs(t)
	e := newDockerEnv(t)
	password := browserUsers(t, e.env)
	runUI(t, e.env, node, script, out, "KLOUD_PASSWORD="+password, "KLOUD_TERMINAL=0",
		"KLOUD_CREDENTIAL=0", "KLOUD_PROVIDER=docker", "KLOUD_MACHINE=dev.0", "KLOUD_TAGS=labels", "KLOUD_PLAN_DEFAULT=must_run",
		"KLOUD_TEMPLATE="+dockerTemplate("dev", 1))
	for _, f := range []string{"plan.png", "machine.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
	}
}
