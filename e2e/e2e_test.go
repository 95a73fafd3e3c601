// Package e2e runs Kloud as a user would: the real binaries (kloud, terraformer, klient) as
// processes, driven through the kloud CLI, with real terraform. TestMain builds the binaries
// once.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	localtf "github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
	vagranttf "github.com/kloud-dev/kloud/providers/vagrant/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

var bin string // directory of the built binaries

// TestMain builds the binaries into a directory of this test process under the project's cache
// (testutil.RunDir), not the system temp dir, and removes it at the end; if the process dies
// first (a -timeout panic), the next run removes it.
func TestMain(m *testing.M) {
	sandbox.MaybeRunInit() // first: a local machine a test creates itself boots from this binary (gc_test.go)
	setupSched()           // sched_test.go
	dir, remove, err := testutil.RunDir("e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		remove()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("go", "build", "-tags", testutil.BuildTags, "-o", dir+"/", "./cmd/kloud", "./cmd/klient", "./cmd/terraformer")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		remove()
		fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
		os.Exit(1)
	}
	bin = dir
	code := m.Run()
	localtf.Cleanup()
	vagranttf.Cleanup()
	tfsandbox.RemoveTestLeftovers() // the groups of the runs of the terraformers and plugins its tests killed
	remove()
	os.Exit(code)
}

// env is one kloud installation: a data dir, a kloud process (restartable), optionally a
// terraformer process of its own.
type env struct {
	t        *testing.T
	dir      string
	addr     string
	kloud    *exec.Cmd
	kloudOut *testutil.SyncBuffer
	extra    []string
	key      string // KLOUD_KEY for CLI calls ("" = admin)
	noDummy  bool   // no dummy provider (newPluginEnv)
	uid      int    // run kloud as this user (0: as the test)
	// tls, if set, serves kloud with TLS (--tls-cert/--tls-key/--ca-cert of these files); the
	// CLI gets the CA as KLOUD_CA_CERT.
	tls *testutil.TLSFiles
	// machinesDir is the dummy provider's --dummy-dir (default <dir>/machines).
	machinesDir string
}

// dummyDir is the dummy provider's directory.
func (e *env) dummyDir() string {
	if e.machinesDir != "" {
		return e.machinesDir
	}
	return filepath.Join(e.dir, "machines")
}

func newEnv(t *testing.T, extra ...string) *env {
	t.Helper()
	testutil.RequireBinary(t, "terraform")
	testutil.RequireBinary(t, "curl")
	e := &env{t: t, dir: t.TempDir(), addr: testutil.FreeLoopback(t), extra: extra}
	e.start()
	t.Cleanup(e.cleanup)
	return e
}

func (e *env) url() string {
	if e.tls != nil {
		return "https://" + e.addr
	}
	return "http://" + e.addr
}

// httpClient is an HTTP client that trusts kloud's certificate (tls.go's CA).
func (e *env) httpClient() *http.Client {
	if e.tls == nil {
		return http.DefaultClient
	}
	cfg, err := tlsconf.Client(e.tls.CA)
	if err != nil {
		e.t.Fatal(err)
	}
	return tlsconf.HTTPClient(cfg, 10*time.Second)
}

// e2ePlanTimeout is the kloud serve --plan-timeout of every kloud the e2e tests start.
const e2ePlanTimeout = "10m"

func (e *env) start() {
	t := e.t
	t.Helper()
	// Tests that want local machines bring their own bridge (--local-*); the others must not
	// create or touch the host's default one (a demo may be using it).
	own := false
	for _, a := range e.extra {
		own = own || strings.HasPrefix(a, "--local-") || a == "--no-local"
	}
	if !own {
		e.extra = append(e.extra, "--no-local")
	}
	// Likewise the docker provider: only tests that bring their own dockerd (--docker-host).
	ownDocker := false
	for _, a := range e.extra {
		ownDocker = ownDocker || strings.HasPrefix(a, "--docker-") || a == "--no-docker"
	}
	if !ownDocker {
		e.extra = append(e.extra, "--no-docker")
	}
	// Likewise the S3 server of buckets (weed: some 11 s of start and 140 MB): only tests of
	// buckets ask for it (--s3 auto); the others run kloud without buckets.
	ownS3 := false
	for _, a := range e.extra {
		ownS3 = ownS3 || a == "--s3" || strings.HasPrefix(a, "--s3=") || strings.HasPrefix(a, "--s3-")
	}
	if !ownS3 {
		e.extra = append(e.extra, "--s3", "off")
	}
	// Likewise the terraformer kloud starts: on a free port of its own, not on 127.0.0.1:7001
	// (taken, kloud serve would pick a free one, but two klouds starting at once in parallel
	// tests both see it free). Chosen once: a restarted kloud keeps its terraformer's address.
	ownTF := false
	for _, a := range e.extra {
		ownTF = ownTF || a == "--terraformer-url" || a == "--terraformer-addr"
	}
	if !ownTF {
		e.extra = append(e.extra, "--terraformer-addr", testutil.FreeLoopback(t))
	}
	args := []string{"serve", "--data-dir", e.dir, "--addr", e.addr,
		"--klient-bin", filepath.Join(bin, "klient"), "--terraformer-bin", filepath.Join(bin, "terraformer"), "--job-lease", "3s",
		// A plan made for a call may take 2 min on one kloud's host (the default); here several
		// klouds, machines and browsers share two cores (CI: a local template's plan ran 102 s).
		"--plan-timeout", e2ePlanTimeout}
	if !e.noDummy {
		args = append(args, "--dummy-dir", e.dummyDir())
	}
	if e.tls != nil {
		args = append(args, "--tls-cert", e.tls.Cert, "--tls-key", e.tls.Key, "--ca-cert", e.tls.CA)
	}
	args = append(args, e.extra...)
	cmd := exec.Command(filepath.Join(bin, "kloud"), args...)
	e.kloudOut = &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = e.kloudOut, e.kloudOut
	if e.uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(e.uid), Gid: uint32(e.uid)}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.kloud = cmd
	hc := e.httpClient()
	testutil.Eventually(t, 60*time.Second, func() bool {
		r, err := hc.Get(e.url() + "/healthz")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && strings.Contains(e.kloudOut.String(), "terraformer: http")
	}, "kloud did not come up:\n%s", e.kloudOut)
}

// kill SIGKILLs kloud (its terraformer child gets SIGTERM from the kernel).
func (e *env) kill() {
	e.kloud.Process.Signal(syscall.SIGKILL)
	e.kloud.Wait()
	e.t.Logf("kloud output until it was killed:\n%s", e.kloudOut)
}

func (e *env) cleanup() {
	if e.kloud.ProcessState == nil {
		e.kloud.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { e.kloud.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			e.kloud.Process.Kill()
			<-done
		}
		if e.t.Failed() {
			e.t.Logf("kloud output:\n%s", e.kloudOut)
		}
	}
	// Machines of the dummy provider are processes: stop any a failed test left behind.
	if err := dummy.KillAll(context.Background(), e.dummyDir()); err != nil {
		e.t.Error(err)
	}
}

// run runs the kloud CLI and returns its stdout; a failure fails the test.
func (e *env) run(args ...string) string {
	e.t.Helper()
	out, err := e.try(args...)
	if err != nil {
		e.t.Fatalf("kloud %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (e *env) try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "kloud"), args...)
	cmd.Env = append(os.Environ(), "KLOUD_URL="+e.url(), "KLOUD_DATA_DIR="+e.dir, "KLOUD_KEY="+e.key)
	if e.tls != nil {
		cmd.Env = append(cmd.Env, "KLOUD_CA_CERT="+e.tls.CA)
	}
	// The buffer is read only after Wait: Wait returns once the copy into it has ended (or
	// WaitDelay after a kill, should a child still hold the pipe).
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after 5m: %w", err)
	}
	return out.String(), err
}

func (e *env) runJSON(v any, args ...string) {
	e.t.Helper()
	out := e.run(append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("kloud %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// alice sets up user alice with a key and a dummy credential, and makes her the CLI's user.
func (e *env) alice() {
	e.run("user", "add", "alice", "--team", "default")
	e.aliceKey()
}

// aliceKey makes the CLI act as alice (added already) with a key of hers, and adds her dummy
// credential.
func (e *env) aliceKey() {
	key := filepath.Join(e.dir, "alice.key")
	e.run("key", "create", "--username", "alice", "--out", key)
	e.key = key
	e.run("credential", "add", "--provider", "dummy", "--title", "mine", "--field", "token=abc123")
}

// members adds users of the default team with password and a key each; it returns their key
// files by name.
func (e *env) members(password string, names ...string) map[string]string {
	pw := filepath.Join(e.t.TempDir(), "password")
	os.WriteFile(pw, []byte(password+"\n"), 0o600)
	keys := map[string]string{}
	for _, u := range names {
		e.run("user", "add", u, "--team", "default", "--password-file", pw)
		keys[u] = filepath.Join(e.dir, u+".key")
		e.run("key", "create", "--username", u, "--out", keys[u])
	}
	return keys
}

func (e *env) template(content string) string {
	f := filepath.Join(e.t.TempDir(), "main.tf")
	os.WriteFile(f, []byte(content), 0o644)
	var t struct{ ID string }
	e.runJSON(&t, "template", "create", "--title", "demo", "--file", f)
	return t.ID
}

// TestWalkthrough walks a stack's life with the dummy provider (no root needed), step by step
// through the CLI.
func TestWalkthrough(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.alice()
	tid := e.template(`
resource "terraform_data" "vm" {
  count = 2
  input = "#!/bin/bash\necho hello from the user script"
}
`)
	plan := e.run("stack", "plan", "--template", tid)
	if !strings.Contains(plan, "vm.0") || !strings.Contains(plan, "vm.1") {
		t.Fatalf("plan:\n%s", plan)
	}
	var created struct{ Stack struct{ ID string } }
	e.runJSON(&created, "stack", "create", "--template", tid)
	sid := created.Stack.ID
	out := e.run("stack", "apply", sid)
	if !strings.Contains(out, "Stack building finished") || !strings.Contains(out, "agent connected") {
		t.Fatalf("apply:\n%s", out)
	}
	ms := e.machines(sid)
	for _, l := range []string{"vm.0", "vm.1"} {
		if ms[l].State != "Running" || ms[l].Agent.Status != "connected" {
			t.Fatalf("%s: %+v", l, ms[l])
		}
	}
	// The agents are real klient processes registered with kontrol.
	kites := e.run("kites", "--name", "klient")
	for _, m := range ms {
		if !strings.Contains(kites, m.KiteID) {
			t.Fatalf("kite %s of %s not registered:\n%s", m.KiteID, m.Label, kites)
		}
	}
	// Sharing: kloud keeps the list and pushes it to the machine's (connected) klient.
	aliceKey := e.key
	e.key = ""
	e.run("user", "add", "bob", "--team", "default")
	e.key = aliceKey
	out = e.run("machine", "share", "vm.0", "bob", "--grant", "readonly", "--stack", sid)
	if !strings.Contains(out, "bob") || !strings.Contains(out, "readonly") || strings.Contains(out, "not connected") {
		t.Fatalf("share:\n%s", out)
	}
	if out := e.run("machine", "shares", "vm.0", "--stack", sid); !strings.Contains(out, "bob") {
		t.Fatalf("shares:\n%s", out)
	}
	e.run("machine", "unshare", "vm.0", "bob", "--stack", sid)
	e.run("machine", "stop", "vm.0", "--stack", sid)
	if m := e.machines(sid)["vm.0"]; m.State != "Stopped" {
		t.Fatalf("after stop: %+v", m)
	}
	e.run("machine", "start", "vm.0", "--stack", sid)
	if m := e.machines(sid)["vm.0"]; m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("after start: %+v", m)
	}
	e.run("stack", "destroy", sid)
	if ms := e.machines(sid); len(ms) != 0 {
		t.Fatalf("machines left: %+v", ms)
	}
	if entries, _ := os.ReadDir(filepath.Join(e.dir, "machines", sid)); len(entries) != 0 {
		t.Fatalf("machine directories left: %v", entries)
	}
}

// TestKloudKilledMidApply SIGKILLs kloud while a stack builds, with terraformer running on its
// own; after a restart the interrupted job is resolved (resumed to the end), no machine stays
// in Building, the lease is free again, and destroy leaves nothing behind.
func TestKloudKilledMidApply(t *testing.T) {
	parallel(t)
	e := newTerraformerEnv(t, testutil.FreeLoopback(t), "")
	e.alice()
	tid := e.template(`
resource "terraform_data" "vm" {
  count = 2
  input = "#!/bin/bash\necho working; sleep 6; echo done"
}
`)
	sid := e.createStack(tid)
	// Kill kloud once terraform has run and the agents are being waited for.
	jobID, j := e.killMidBuild(sid, 70, 60*time.Second)
	if j.Status != "succeeded" {
		t.Fatalf("job %s after the restart: %+v", jobID, j)
	}
	e.checkResumedBuild(sid, 2, j)
	e.run("stack", "destroy", sid)
	if entries, _ := os.ReadDir(filepath.Join(e.dir, "machines", sid)); len(entries) != 0 {
		t.Fatalf("machine directories left: %v", entries)
	}
}
