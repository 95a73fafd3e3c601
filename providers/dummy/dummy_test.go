package dummy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
	"github.com/kloud-dev/kloud/terraformer/tfrun/tfruntest"
	"github.com/kloud-dev/kloud/userdata"
)

// fakeKlient stands in for the klient binary: provision.sh downloads it from "kloud", checks its
// sha256 and runs it under its supervisor, which is all this package's tests need of an agent
// (kloud's flow tests run the real klient).
const fakeKlient = "#!/bin/bash\nexec sleep 600\n"

// kloudEnv is what the provider needs of kloud: an HTTP server with /dl/klient and the
// provider's handler mounted the way kloud mounts it, and a stack of machines to apply.
type kloudEnv struct {
	t   *testing.T
	p   *provider.Provider
	dir string
	srv *httptest.Server
	eng *tfrun.Engine
	n   int // builds so far: each gets its own kite key, as kloud mints one per build
	// noSandbox runs terraform without terraformer's sandbox (terraformer --insecure-no-sandbox).
	noSandbox bool
}

func newKloud(t *testing.T, o dummy.Options) *kloudEnv {
	t.Helper()
	testutil.RequireBinary(t, "curl")
	o.Dir = filepath.Join(t.TempDir(), "machines")
	o.Logger = testutil.Logger(t)
	p := dummy.New(o)
	reg := provider.NewRegistry()
	reg.Register(p)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /dl/klient", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(fakeKlient)) })
	reg.MountHandlers(mux.Handle)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	e := &kloudEnv{t: t, p: p, dir: o.Dir, srv: srv}
	t.Cleanup(e.killLeftovers)
	return e
}

// killLeftovers stops machine processes a failed test left running (by the pids in machine
// roots); a passing test has destroyed them.
func (e *kloudEnv) killLeftovers() {
	filepath.Walk(e.dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && (fi.Name() == "klient-supervisor.pid" || fi.Name() == "provision.pid") {
			b, _ := os.ReadFile(p)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}

const twoVMs = `
resource "terraform_data" "vm" {
  count = 2
  input = "#!/bin/bash\necho hello from the user script of $KLOUD_OWNER"
}
`

// template runs the provider's ApplyTemplate for the stack's machines, as a build does.
func (e *kloudEnv) template(stackID, main string, labels ...string) *provider.Template {
	e.t.Helper()
	sumb := sha256.Sum256([]byte(fakeKlient))
	e.n++
	key := fmt.Sprintf("eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhbGljZSIsIm4iOiR%d9.c2ln", e.n)
	bs := &provider.BaseStack{
		Provider: e.p, StackID: stackID, Team: "default", Owner: "alice",
		Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(main)}, Variables: map[string]any{}},
		AgentConfig: func(ctx context.Context, m *provider.MachineSpec) (userdata.Config, error) {
			return userdata.Config{Username: "alice", KiteKey: key,
				KontrolURL: e.srv.URL + "/kite", KlientURL: e.srv.URL + "/dl/klient", KlientSHA256: hex.EncodeToString(sumb[:])}, nil
		},
		Log: testutil.Logger(e.t),
	}
	for _, l := range labels {
		res, idx, counted := strings.Cut(l, ".")
		spec := &provider.MachineSpec{ID: "m-" + l, Label: l, Resource: res, Provider: e.p.Name}
		if counted {
			i, _ := strconv.Atoi(idx)
			spec.Index = &i
		}
		bs.Machines = append(bs.Machines, spec)
	}
	st, err := e.p.Stack(bs)
	if err != nil {
		e.t.Fatal(err)
	}
	cred := &provider.Credential{Provider: e.p.Name, Value: &dummy.Credential{Token: "abc", Region: "local-1"}}
	tpl, err := st.ApplyTemplate(e.t.Context(), cred)
	if err != nil {
		e.t.Fatalf("ApplyTemplate: %v", err)
	}
	return tpl
}

// terraform runs a real terraform apply or destroy of the stack (tfrun, as terraformer does).
func (e *kloudEnv) terraform(op tfrun.Op, stackID string, tpl *provider.Template) *tfrun.Job {
	e.t.Helper()
	if e.eng == nil {
		e.eng = tfruntest.NewEngine(e.t, tfrun.Options{InsecureNoSandbox: e.noSandbox})
	}
	req := tfrun.Request{Op: op, ContentID: "stack-" + stackID}
	if tpl != nil {
		req.Files, req.Variables = tpl.Files, tpl.Variables
	}
	job, err := e.eng.Submit(e.t.Context(), req)
	if err != nil {
		e.t.Fatalf("terraform %s: %v", op, err)
	}
	return tfruntest.Wait(e.t, e.eng, job.ID, 3*time.Minute)
}

func (e *kloudEnv) machine(stackID, label string) provider.Machine {
	e.t.Helper()
	m, err := e.p.Machine(&provider.BaseMachine{ID: "m-" + label, Label: label, StackID: stackID, Provider: e.p, Log: testutil.Logger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

func supervisorPID(t *testing.T, root string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, userdata.SupervisorPIDPath))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// A real terraform apply boots the machines through the provider's service: the boot
// resources are in terraform's state, provisioning runs to its end (klient downloaded, checked,
// started; the user's script ran) in processes that outlive terraform; stop and start work; a
// real terraform destroy kills the processes and removes the directories. Terraform runs sandboxed
// (as terraformer runs it) and, for development, without the sandbox.
func TestApplyBootsAndDestroyRemoves(t *testing.T) {
	t.Run("sandbox", func(t *testing.T) { testApplyBootsAndDestroyRemoves(t, false) })
	t.Run("no-sandbox", func(t *testing.T) { testApplyBootsAndDestroyRemoves(t, true) })
}

func testApplyBootsAndDestroyRemoves(t *testing.T, noSandbox bool) {
	e := newKloud(t, dummy.Options{})
	e.noSandbox = noSandbox
	tpl := e.template("st1", twoVMs, "vm.0", "vm.1")
	gen := string(tpl.Files["kloud_dummy.tf.json"])
	if strings.Contains(gen, e.dir) || !strings.Contains(gen, "/provider/dummy/v1") {
		t.Fatalf("generated template names the machines' directory or not the service:\n%s", gen)
	}
	if job := e.terraform(tfrun.OpApply, "st1", tpl); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("apply: %s: %s\n%s", job.Status, job.Error, strings.Join(job.Log, "\n"))
	}
	st, err := e.eng.State(t.Context(), "stack-st1")
	if err != nil {
		t.Fatal(err)
	}
	var boots []string
	for _, r := range st.Values.RootModule.Resources {
		if strings.HasPrefix(r.Address, "terraform_data.kloud_boot_vm") {
			boots = append(boots, r.Address)
		}
	}
	if len(boots) != 2 {
		t.Fatalf("boot resources in the state: %v", boots)
	}
	var pids []int
	for _, l := range []string{"vm.0", "vm.1"} {
		m := e.machine("st1", l)
		var log string
		testutil.Eventually(t, time.Minute, func() bool {
			log, err = m.(provider.ConsoleLogger).ConsoleLog(t.Context())
			return err == nil && strings.Contains(log, "KLOUD-PROVISION step=done status=ok")
		}, "%s did not finish provisioning: %v\n%s", l, err, log)
		if !strings.Contains(log, "hello from the user script of alice") || !strings.Contains(log, "KLOUD-PROVISION step=verify status=ok") {
			t.Fatalf("%s console:\n%s", l, log)
		}
		if s, _, err := m.Info(t.Context()); s != provider.Running || err != nil {
			t.Fatalf("%s: %s, %v", l, s, err)
		}
		pids = append(pids, supervisorPID(t, filepath.Join(e.dir, "st1", l)))
	}

	m := e.machine("st1", "vm.0")
	if _, err := m.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s, _, _ := m.Info(t.Context()); s != provider.Stopped {
		t.Fatalf("after stop: %s", s)
	}
	if _, err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s, _, _ := m.Info(t.Context()); s != provider.Running {
		t.Fatalf("after start: %s", s)
	}
	pids[0] = supervisorPID(t, filepath.Join(e.dir, "st1", "vm.0"))

	if job := e.terraform(tfrun.OpDestroy, "st1", nil); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("destroy: %s: %s\n%s", job.Status, job.Error, strings.Join(job.Log, "\n"))
	}
	if _, err := os.Stat(filepath.Join(e.dir, "st1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stack's machine directory is still there: %v", err)
	}
	for _, pid := range pids {
		testutil.Eventually(t, 10*time.Second, func() bool { return !alive(pid) }, "supervisor %d still runs after destroy", pid)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, e.dir) // klient, the user's script: nothing
	if s, _, _ := m.Info(t.Context()); s != provider.Terminated {
		t.Fatalf("after destroy: %s", s)
	}
}

// alive reports whether pid runs (zombies, waiting for init to reap them, count as gone).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// Options.Fail["Boot"] makes the service refuse: terraform apply fails, nothing boots.
func TestBootFailureFailsTheApply(t *testing.T) {
	e := newKloud(t, dummy.Options{Fail: map[string]error{"Boot": errors.New("no capacity in local-1")}})
	tpl := e.template("st2", `resource "terraform_data" "web" {
  input = "#!/bin/bash\necho hi"
}
`, "web")
	job := e.terraform(tfrun.OpApply, "st2", tpl)
	if job.Status != tfrun.StatusFailed || job.Error == nil || !strings.Contains(job.Error.Error(), "dummy.Boot: no capacity in local-1") {
		t.Fatalf("apply: %s: %s", job.Status, job.Error)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "st2", "web", "run")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the machine booted anyway: %v", err)
	}
	t.Logf("apply failed as it should: %s", job.Error)
	// Destroy cleans up what the failed apply left (the machine resource, the tainted boot).
	if job := e.terraform(tfrun.OpDestroy, "st2", nil); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("destroy: %s: %s", job.Status, job.Error)
	}
}

// The service boots only machines of the token's stack, only the exact script kloud rendered,
// only with an unexpired token; destroy needs a valid token of the stack too. Nothing refused
// leaves a directory.
func TestServiceRefusals(t *testing.T) {
	e := newKloud(t, dummy.Options{})
	tpl := e.template("st3", `resource "terraform_data" "web" {
  input = "#!/bin/bash\necho hi"
}
`, "web")
	token, _ := tpl.Variables["kloud_dummy_token"].(string)
	if token == "" {
		t.Fatalf("no token variable: %v", tpl.Variables)
	}
	other := e.template("st4", `resource "terraform_data" "db" {
  input = "#!/bin/bash\necho hi"
}
`, "db")
	otherToken := other.Variables["kloud_dummy_token"].(string)
	base := e.srv.URL + "/provider/dummy/v1/machines/"
	post := func(path, tok, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		fmt.Fprint(&b, res.Status)
		buf := make([]byte, 512)
		n, _ := res.Body.Read(buf)
		return res.StatusCode, b.String() + " " + string(buf[:n])
	}
	tampered := token[:len(token)-3] + "AAA"
	for _, c := range []struct {
		name, path, tok, body string
		want                  int
	}{
		{"no token", "web/boot", "", "#!/bin/bash\n", http.StatusUnauthorized},
		{"tampered token", "web/boot", tampered, "#!/bin/bash\n", http.StatusUnauthorized},
		{"another stack's machine", "web/boot", otherToken, "#!/bin/bash\n", http.StatusForbidden},
		{"a script kloud did not render", "web/boot", token, "#!/bin/bash\ntouch /tmp/kloud-dummy-pwned\n", http.StatusForbidden},
		{"a label that is a path", "..%2F..%2Fetc/boot", token, "", http.StatusBadRequest},
		{"destroy of another stack's machine", "web/destroy", otherToken, "", http.StatusForbidden},
		{"destroy with a tampered token", "web/destroy", tampered, "", http.StatusUnauthorized},
	} {
		if code, msg := post(c.path, c.tok, c.body); code != c.want {
			t.Errorf("%s: got %s, want %d", c.name, msg, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dir, "st3")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused request made a machine directory: %v", err)
	}
	if _, err := os.Stat("/tmp/kloud-dummy-pwned"); err == nil {
		os.Remove("/tmp/kloud-dummy-pwned")
		t.Fatal("a script kloud did not render ran")
	}

	// An expired token may destroy its stack's machines but not boot them (expiry is in whole
	// seconds: a 1ns token has expired at once).
	e2 := newKloud(t, dummy.Options{TokenTTL: time.Nanosecond})
	tpl = e2.template("st5", `resource "terraform_data" "web" {
  input = "#!/bin/bash\necho hi"
}
`, "web")
	expired := tpl.Variables["kloud_dummy_token"].(string)
	base = e2.srv.URL + "/provider/dummy/v1/machines/"
	if code, msg := post("web/boot", expired, "#!/bin/bash\n"); code != http.StatusUnauthorized || !strings.Contains(msg, "expired") {
		t.Errorf("boot with an expired token: %s", msg)
	}
	if code, msg := post("web/destroy", expired, ""); code != http.StatusOK {
		t.Errorf("destroy with an expired token: %s", msg)
	}
}

// A boot that fails after the machine's script started provisioning fails the apply and leaves
// nothing of the machine (no process, no directory), not even what started while it failed.
func TestFailedBootLeavesNothing(t *testing.T) {
	e := newKloud(t, dummy.Options{Fail: map[string]error{"BootScript": errors.New("the host ran out of disk")}})
	tpl := e.template("st6", `resource "terraform_data" "web" {
  input = "#!/bin/bash\necho hi"
}
`, "web")
	job := e.terraform(tfrun.OpApply, "st6", tpl)
	if job.Status != tfrun.StatusFailed || job.Error == nil || !strings.Contains(job.Error.Error(), "the host ran out of disk") {
		t.Fatalf("apply: %s: %v", job.Status, job.Error)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "st6")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed boot left %s: %v", filepath.Join(e.dir, "st6"), err)
	}
	tfruntest.AssertNoProcesses(t, 30*time.Second, filepath.Join(e.dir, "st6"))
	if job := e.terraform(tfrun.OpDestroy, "st6", nil); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("destroy: %s: %v", job.Status, job.Error)
	}
}

// Building a stack again renders new agent keys, so new scripts: the machines boot again (a new
// provisioning with the new key, the old processes gone), as a cloud replaces an instance whose
// user data changed. Applying the same script again changes nothing.
func TestNewScriptBootsAgain(t *testing.T) {
	e := newKloud(t, dummy.Options{})
	const main = `resource "terraform_data" "web" {
  input = "#!/bin/bash\necho hi"
}
`
	root := filepath.Join(e.dir, "st7", "web")
	booted := func() (int, string) {
		t.Helper()
		m := e.machine("st7", "web")
		var log string
		var err error
		testutil.Eventually(t, time.Minute, func() bool {
			log, err = m.(provider.ConsoleLogger).ConsoleLog(t.Context())
			return err == nil && strings.Contains(log, "KLOUD-PROVISION step=done status=ok")
		}, "web did not finish provisioning: %v\n%s", err, log)
		key, err := os.ReadFile(filepath.Join(root, userdata.KiteKeyPath))
		if err != nil {
			t.Fatal(err)
		}
		return supervisorPID(t, root), string(key)
	}
	tpl := e.template("st7", main, "web")
	if job := e.terraform(tfrun.OpApply, "st7", tpl); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("apply: %s: %v", job.Status, job.Error)
	}
	pid1, key1 := booted()

	if job := e.terraform(tfrun.OpApply, "st7", tpl); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("apply again: %s: %v", job.Status, job.Error)
	}
	if pid, _ := booted(); pid != pid1 {
		t.Fatalf("the same script booted the machine again (supervisor %d, was %d)", pid, pid1)
	}

	tpl = e.template("st7", main, "web")
	if job := e.terraform(tfrun.OpApply, "st7", tpl); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("apply a new build: %s: %v", job.Status, job.Error)
	}
	pid2, key2 := booted()
	if pid2 == pid1 || key2 == key1 {
		t.Fatalf("not booted again: supervisor %d (was %d), key %q (was %q)", pid2, pid1, key2, key1)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return !alive(pid1) }, "the old supervisor %d still runs", pid1)
	if job := e.terraform(tfrun.OpDestroy, "st7", nil); job.Status != tfrun.StatusSucceeded {
		t.Fatalf("destroy: %s: %v", job.Status, job.Error)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "st7")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("left after destroy: %v", err)
	}
}
