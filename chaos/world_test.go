package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
)

// world is one kloud installation with the local provider on a private host (bridge, subnet,
// machine state dir: tfprovidertest.Host): `kloud serve` with its embedded store and the
// terraformer it supervises (a child of kloud: it dies with it, as in a deployment), driven
// through the kloud CLI as user alice. Everything it made is removed when the test ends, also
// when a check failed.
type world struct {
	t      *testing.T
	h      *tfprovidertest.Host
	dir    string // kloud's data dir
	addr   string // kloud's address on the bridge
	tfAddr string // its terraformer's (kept across restarts)
	tfCfg  string // the Terraform CLI config with the kloudlocal mirror
	key    string // alice's key file ("" until she exists)
	// machineType is the Terraform resource type of the stacks' machines: kloudlocal_machine,
	// or terraform_data with the example provider plugin (withExample).
	machineType string

	kloud   *exec.Cmd
	out     *testutil.SyncBuffer
	exited  chan struct{}
	started time.Time // when the current kloud answered /healthz
}

// newWorld starts a world (root, the base image and terraform are required: skipped loudly
// without, failed under CI=true) with user alice, her key and her team.
func newWorld(t *testing.T) *world {
	t.Helper()
	testutil.RequireBinary(t, "terraform")
	h := tfprovidertest.NewHost(t) // gates on root; removes machines and bridge at the end
	_, cfg := tfprovidertest.Terraform(t)
	_, port, _ := net.SplitHostPort(testutil.FreeLoopback(t))
	w := &world{t: t, h: h, dir: t.TempDir(), addr: net.JoinHostPort(h.HostAddr().String(), port),
		tfAddr: testutil.FreeLoopback(t), tfCfg: cfg, machineType: "kloudlocal_machine"}
	t.Cleanup(w.stop)
	w.start()
	w.mustCLI("user", "add", "alice", "--team", "default")
	key := filepath.Join(w.dir, "alice.key")
	w.mustCLI("key", "create", "--username", "alice", "--out", key)
	w.key = key
	return w
}

// withExample installs the example provider (examples/provider-example) as a plugin of the
// world's kloud (sandboxed, started by kloud's plugin host), gives alice a credential of it and
// bootstraps it; the world's templates are then the example's machines (terraform_data).
func (w *world) withExample() {
	t := w.t
	t.Helper()
	bin := testutil.BuildBinary(t, "./examples/provider-example")
	if out, err := w.cliAs("", 2*time.Minute, "provider", "install", bin, "--name", "example", "--wait", "90s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var cred struct{ ID string }
	if err := w.cliJSON(&cred, "credential", "add", "--provider", "example", "--title", "chaos", "--field", "label=chaos"); err != nil {
		t.Fatal(err)
	}
	w.mustCLI("credential", "bootstrap", cred.ID)
	w.machineType = "terraform_data"
}

// plugin is the pid of the example provider's plugin process under kloud, 0 if none runs.
func (w *world) plugin() int {
	bin := filepath.Join(w.dir, "plugins", "kloud-provider-example")
	for _, p := range descendants(procs(), w.kloud.Process.Pid) {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/cmdline")
		if arg0, _, _ := strings.Cut(string(cmdline), "\x00"); arg0 == bin {
			return p.pid
		}
	}
	return 0
}

// start starts kloud and returns once it answers /healthz and its terraformer is up.
func (w *world) start() {
	t := w.t
	t.Helper()
	cmd := exec.Command(built.kloud, "serve", "--data-dir", w.dir, "--addr", w.addr, "--public-url", "http://"+w.addr,
		"--klient-bin", built.klient, "--terraformer-bin", built.terraformer, "--terraformer-addr", w.tfAddr,
		"--no-demo", "--no-docker", "--s3", "off",
		"--local-state-dir", w.h.StateDir, "--local-bridge", w.h.Bridge, "--local-subnet", w.h.Subnet.String())
	cmd.Env = append(os.Environ(), "TF_CLI_CONFIG_FILE="+w.tfCfg)
	w.out = &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = w.out, w.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.kloud, w.exited = cmd, make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(cmd, w.exited)
	testutil.Eventually(t, 90*time.Second, func() bool {
		r, err := http.Get("http://" + w.addr + "/healthz")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && r.StatusCode == http.StatusOK && strings.Contains(w.out.String(), "terraformer: http")
	}, "kloud did not come up:\n%s", w.out)
	w.started = time.Now()
}

// killKloud SIGKILLs kloud (its terraformer gets SIGTERM from the kernel and exits).
func (w *world) killKloud() {
	w.kloud.Process.Signal(syscall.SIGKILL)
	<-w.exited
}

// stop ends kloud (SIGTERM, then SIGKILL after 30 s) and, if the test failed, logs its output.
func (w *world) stop() {
	if w.kloud == nil {
		return
	}
	select {
	case <-w.exited:
	default:
		w.kloud.Process.Signal(syscall.SIGTERM)
		select {
		case <-w.exited:
		case <-time.After(30 * time.Second):
			w.kloud.Process.Kill()
			<-w.exited
		}
	}
	if w.t.Failed() {
		w.t.Logf("kloud's output:\n%s", w.out)
	}
	// What a failed run left running in the data dir (the example provider's machines, a
	// terraform run) goes too; local machines go with the host (tfprovidertest.NewHost).
	for _, p := range procs() {
		if cwd, _ := os.Readlink("/proc/" + strconv.Itoa(p.pid) + "/cwd"); cwd == w.dir || strings.HasPrefix(cwd, w.dir+"/") {
			w.t.Logf("killing %s (pid %d), left running in %s", p.comm, p.pid, cwd)
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// cli runs the kloud CLI as alice (as the administrator before she exists) with a deadline, and
// returns what it printed (stdout and stderr).
func (w *world) cli(timeout time.Duration, args ...string) (string, error) {
	return w.cliAs(w.key, timeout, args...)
}

// cliAs is cli with the key file key ("": kloud's administrator).
func (w *world) cliAs(key string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, built.kloud, args...)
	cmd.Env = append(os.Environ(), "KLOUD_URL=http://"+w.addr, "KLOUD_DATA_DIR="+w.dir, "KLOUD_KEY="+key)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("kloud %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), err
}

func (w *world) mustCLI(args ...string) string {
	w.t.Helper()
	out, err := w.cli(5*time.Minute, args...)
	if err != nil {
		w.t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// cliJSON runs the CLI with --json and decodes what it printed into v.
func (w *world) cliJSON(v any, args ...string) error {
	out, err := w.cli(time.Minute, append(args, "--json")...)
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("kloud %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// template creates a template of n kloudlocal machines and returns its id; updateTemplate
// gives it a new revision of m machines.
func (w *world) template(n int) string {
	var tpl struct{ ID string }
	if err := w.cliJSON(&tpl, "template", "create", "--title", "chaos", "--file", w.templateFile(n)); err != nil {
		w.t.Fatal(err)
	}
	return tpl.ID
}

func (w *world) updateTemplate(id string, m int) {
	w.mustCLI("template", "update", id, "--file", w.templateFile(m))
}

func (w *world) templateFile(n int) string {
	f := filepath.Join(w.t.TempDir(), "main.tf")
	src := `resource "terraform_data" "vm" {
  count = ` + strconv.Itoa(n) + `
  input = "#!/bin/bash\necho chaos"
}
`
	if w.machineType == "kloudlocal_machine" {
		src = `terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

resource "kloudlocal_machine" "vm" {
  count     = ` + strconv.Itoa(n) + `
  hostname  = "vm-${count.index}"
  memory    = 256
  user_data = "#!/bin/bash\necho chaos"
}
`
	}
	if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
		w.t.Fatal(err)
	}
	return f
}

// createStack creates a stack of template tid and returns its id.
func (w *world) createStack(tid string) string {
	var created struct{ Stack struct{ ID string } }
	if err := w.cliJSON(&created, "stack", "create", "--template", tid); err != nil {
		w.t.Fatal(err)
	}
	return created.Stack.ID
}

var jobRE = regexp.MustCompile(`\bjob ([0-9A-Za-z_-]+)`)

// startJob runs a CLI command that starts a job detached (its --detach is added) and returns
// the job's id.
func (w *world) startJob(args ...string) string {
	w.t.Helper()
	out := w.mustCLI(append(args, "--detach")...)
	m := jobRE.FindStringSubmatch(out)
	if m == nil {
		w.t.Fatalf("kloud %s: no job in its output:\n%s", strings.Join(args, " "), out)
	}
	return m[1]
}

// job is job.get's answer, or an error.
func (w *world) job(id string) (api.Job, error) {
	var j api.Job
	err := w.cliJSON(&j, "job", "get", id)
	return j, err
}

// waitJob polls job id until it ends or timeout passes; it returns the job as last seen.
func (w *world) waitJob(id string, timeout time.Duration) api.Job {
	var j api.Job
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if got, err := w.job(id); err == nil {
			j = got
			if j.Status.Done() {
				return j
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return j
}

// machine is a machine as `kloud machine list --json` shows it.
type machine struct {
	ID, Label, State, Reason, IPAddress string
	Agent                               struct{ Status string }
	Attributes                          map[string]any
}

// sandboxID is its kloudlocal_machine id (the sandbox library's).
func (m machine) sandboxID() string { s, _ := m.Attributes["id"].(string); return s }

func (w *world) machines(sid string) ([]machine, error) {
	var ms []machine
	err := w.cliJSON(&ms, "machine", "list", "--stack", sid)
	return ms, err
}

// stackState is `kloud stack describe`'s state and reason; found is false once the stack is gone.
func (w *world) stackState(sid string) (state, reason string, found bool, err error) {
	var st struct{ State, Reason string }
	out, err := w.cli(time.Minute, "stack", "describe", sid, "--json")
	if err != nil {
		if strings.Contains(out, "not found") {
			return "", "", false, nil
		}
		return "", "", false, fmt.Errorf("%w\n%s", err, out)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return "", "", false, fmt.Errorf("stack describe: %w\n%s", err, out)
	}
	return st.State, st.Reason, true, nil
}

// stacks is alice's stacks' ids.
func (w *world) stacks() ([]string, error) {
	var sts []struct{ ID string }
	if err := w.cliJSON(&sts, "stack", "list"); err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range sts {
		ids = append(ids, s.ID)
	}
	return ids, nil
}

// running reports whether stack sid's machines are n, each Running with its agent connected,
// and the stack Initialized; if not, what is not.
func (w *world) running(sid string, n int) (bool, string) {
	state, reason, found, err := w.stackState(sid)
	if err != nil || !found || state != "Initialized" {
		return false, fmt.Sprintf("stack %s: state %q reason %q found %v err %v", sid, state, reason, found, err)
	}
	ms, err := w.machines(sid)
	if err != nil || len(ms) != n {
		return false, fmt.Sprintf("stack %s: %d machines, want %d (%v)", sid, len(ms), n, err)
	}
	for _, m := range ms {
		if m.State != "Running" || m.Agent.Status != "connected" {
			return false, fmt.Sprintf("%s: %s, agent %q (%s)", m.Label, m.State, m.Agent.Status, m.Reason)
		}
	}
	return true, ""
}
