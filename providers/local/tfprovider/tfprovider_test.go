package tfprovider_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

func TestMain(m *testing.M) {
	sandbox.MaybeRunInit() // the service (in this process) boots machines from this binary
	tfsandbox.MaybeRun()   // terraform runs through this binary as terraformer's sandbox launcher
	code := m.Run()
	tfprovidertest.Cleanup()
	os.Exit(code)
}

// bootTimeout bounds create → cloud-init done (a few seconds idle; CI shares 2 cores).
const bootTimeout = 3 * time.Minute

// nobody is the user terraform runs as in these tests, as terraformer's sandbox runs it: the
// provider needs no privilege, only kloud's service.
const nobody = 65534

// workdir is a Terraform working directory using the test mirror. As root, terraform runs as
// terraformer runs it: through the tfsandbox launcher, as nobody without capabilities, in its own
// pid and mount namespaces that show only the system dirs, the mirror and the work dir.
type workdir struct {
	t         *testing.T
	dir       string
	terraform string
	env       []string
	asNobody  bool
	sandbox   map[string]string // the launcher's environment
}

func newWorkdir(t *testing.T, mainTF string) *workdir {
	t.Helper()
	tf, cliConfig := tfprovidertest.Terraform(t)
	w := &workdir{t: t, dir: t.TempDir(), terraform: tf, asNobody: os.Geteuid() == 0}
	if w.asNobody {
		for _, d := range []string{filepath.Dir(w.dir), w.dir} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(w.dir, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	w.env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + w.dir,
		"TF_CLI_CONFIG_FILE=" + cliConfig, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1"}
	if w.asNobody {
		mirrors, err := tfsandbox.CLIConfigPaths(cliConfig)
		if err != nil {
			t.Fatal(err)
		}
		cfg := tfsandbox.Config{Program: tf, WorkDir: w.dir, ReadOnly: append([]string{cliConfig}, mirrors...), UID: nobody, GID: nobody}
		if w.sandbox, err = cfg.Env(fmt.Sprintf("tfprovider-test-%d", os.Getpid())); err != nil {
			t.Fatal(err)
		}
	}
	w.write(mainTF)
	if out, err := w.run("init", "-input=false"); err != nil {
		t.Fatalf("terraform init: %s\n%s", err, out)
	}
	return w
}

func (w *workdir) write(mainTF string) {
	w.t.Helper()
	p := filepath.Join(w.dir, "main.tf")
	if err := os.WriteFile(p, []byte(mainTF), 0o644); err != nil {
		w.t.Fatal(err)
	}
	if w.asNobody {
		os.Chown(p, nobody, nobody)
	}
}

// run runs terraform and returns its combined output.
func (w *workdir) run(args ...string) (string, error) {
	w.t.Helper()
	cmd := exec.Command(w.terraform, append(args, "-no-color")...)
	cmd.Dir, cmd.Env = w.dir, w.env
	if w.asNobody {
		cmd.Path, cmd.Args[0] = "/proc/self/exe", "terraform"
		for k, v := range w.sandbox {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (w *workdir) must(args ...string) string {
	w.t.Helper()
	t0 := time.Now()
	out, err := w.run(args...)
	if err != nil {
		w.t.Fatalf("terraform %s: %s\n%s", strings.Join(args, " "), err, out)
	}
	w.t.Logf("terraform %s: %s", args[0], time.Since(t0).Round(time.Millisecond))
	return out
}

// planExit runs plan -detailed-exitcode: 0 no changes, 2 changes.
func (w *workdir) planExit() (int, string) {
	w.t.Helper()
	out, err := w.run("plan", "-input=false", "-detailed-exitcode")
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out
	case errors.As(err, &ee) && ee.ExitCode() == 2:
		return 2, out
	}
	w.t.Fatalf("terraform plan: %s\n%s", err, out)
	return -1, ""
}

// machines returns the kloudlocal_machine instances in the state, by index.
func (w *workdir) machines() []map[string]any {
	w.t.Helper()
	out := w.must("show", "-json")
	var st struct {
		Values struct {
			RootModule struct {
				Resources []struct {
					Type   string         `json:"type"`
					Index  any            `json:"index"`
					Values map[string]any `json:"values"`
				} `json:"resources"`
			} `json:"root_module"`
		} `json:"values"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		w.t.Fatalf("terraform show -json: %s\n%s", err, out)
	}
	var ms []map[string]any
	for _, r := range st.Values.RootModule.Resources {
		if r.Type == "kloudlocal_machine" {
			ms = append(ms, r.Values)
		}
	}
	return ms
}

// service serves kloud's local machine service for h on loopback, as kloud does, and returns its
// endpoint and the provider (for tokens).
func service(t *testing.T, h *tfprovidertest.Host) (string, *local.Local) {
	t.Helper()
	l, err := local.New(local.Options{
		StateDir: h.StateDir, BaseImage: h.BaseImage, Bridge: h.Bridge, Subnet: h.Subnet,
		Instance: "kloud-test", Endpoint: "unused", Logger: testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(l.Provider().Handler)
	t.Cleanup(srv.Close)
	return srv.URL, l
}

func providerBlock(endpoint, token string) string {
	return fmt.Sprintf(`terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal", version = "0.1.0" }
  }
}

provider "kloudlocal" {
  endpoint = %q
  token    = %q
}
`, endpoint, token)
}

// kloudTags are the tags kloud gives web[i]: stack s1, machine m<i>.
const kloudTags = `kloud_stack = "s1", kloud_machine = "m${count.index}"`

func machinesTF(endpoint, token, tags string) string {
	return providerBlock(endpoint, token) + `
resource "kloudlocal_machine" "web" {
  count     = 2
  hostname  = "web-${count.index}"
  memory    = 256
  cpus      = 0.5
  tags      = ` + tags + `
  user_data = <<-EOT
    #cloud-config
    write_files:
      - path: /root/hello
        content: "hello from web-${count.index}\n"
    runcmd:
      - [sh, -c, "hostname > /root/hostname"]
  EOT
}

output "ids" { value = kloudlocal_machine.web[*].id }
`
}

// waitCloudInit polls Info until cloud-init finished in machine id, and fails on errors.
func waitCloudInit(t *testing.T, h *tfprovidertest.Host, id string) sandbox.Info {
	t.Helper()
	var info sandbox.Info
	console := func() string {
		b, _ := os.ReadFile(filepath.Join(h.StateDir, id, "console.log"))
		return string(b)
	}
	testutil.Eventually(t, bootTimeout, func() bool {
		var err error
		if info, err = h.Manager.Info(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if info.State != sandbox.StateRunning {
			t.Fatalf("machine %s is %s while waiting for cloud-init:\n%s", id, info.State, console())
		}
		return info.CloudInit == sandbox.CloudInitDone || info.CloudInit == sandbox.CloudInitError
	}, "cloud-init in %s did not finish:\n%s", id, console())
	if info.CloudInit != sandbox.CloudInitDone {
		t.Fatalf("cloud-init in %s: %s\n%s", id, info.CloudInit, console())
	}
	return info
}

func execIn(t *testing.T, h *tfprovidertest.Host, id string, argv ...string) string {
	t.Helper()
	out, err := h.Manager.Exec(t.Context(), id, argv...)
	if err != nil {
		t.Fatalf("exec %v in %s: %s", argv, id, err)
	}
	return strings.TrimSpace(string(out))
}

// The whole life of kloudlocal_machine through real terraform, run as nobody, against kloud's
// local machine service: create two machines that run cloud-init and outlive terraform, no diff
// on a second plan (also with a stopped machine), tags updated in place, a machine removed behind
// Terraform's back is planned again, destroy leaves nothing behind.
func TestMachineLifecycle(t *testing.T) {
	h := tfprovidertest.NewHost(t)
	endpoint, l := service(t, h)
	token, err := l.Token("s1", []string{"m0", "m1"})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorkdir(t, machinesTF(endpoint, token, `{ team = "a", `+kloudTags+` }`))
	t0 := time.Now()
	w.must("apply", "-input=false", "-auto-approve")
	t.Logf("apply of 2 machines: %s", time.Since(t0).Round(time.Millisecond))

	ms := w.machines()
	if len(ms) != 2 {
		t.Fatalf("state has %d machines, want 2: %v", len(ms), ms)
	}
	var infos []sandbox.Info
	for i, m := range ms {
		id, _ := m["id"].(string)
		if m["state"] != "running" || m["ip_address"] == "" || !strings.HasPrefix(id, fmt.Sprintf("web-%d-", i)) {
			t.Fatalf("machine %d in state: %v", i, m)
		}
		// terraform and the provider have exited: the machine runs on.
		info := waitCloudInit(t, h, id)
		infos = append(infos, info)
		if info.IP.String() != m["ip_address"] || !h.Subnet.Contains(info.IP) {
			t.Errorf("machine %s: ip %s, state says %v", id, info.IP, m["ip_address"])
		}
		if got := execIn(t, h, id, "cat", "/root/hello"); got != fmt.Sprintf("hello from web-%d", i) {
			t.Errorf("machine %s: /root/hello = %q", id, got)
		}
		if got := execIn(t, h, id, "hostname"); got != fmt.Sprintf("web-%d", i) {
			t.Errorf("machine %s: hostname %q", id, got)
		}
		if got := execIn(t, h, id, "cat", "/root/hostname"); got != fmt.Sprintf("web-%d", i) {
			t.Errorf("machine %s: hostname seen by cloud-init's runcmd %q", id, got)
		}
		if info.MemoryMB != 256 || info.CPUs != 0.5 || info.Instance != "kloud-test" ||
			!maps.Equal(info.Tags, map[string]string{"team": "a", "kloud_stack": "s1", "kloud_machine": fmt.Sprintf("m%d", i)}) {
			t.Errorf("machine %s: memory %d cpus %g tags %v", id, info.MemoryMB, info.CPUs, info.Tags)
		}
	}

	if code, out := w.planExit(); code != 0 {
		t.Fatalf("second plan wants changes:\n%s", out)
	}
	// kloud stops machines outside Terraform: a stopped machine is not drift.
	if _, err := h.Manager.Stop(t.Context(), infos[1].ID); err != nil {
		t.Fatal(err)
	}
	if code, out := w.planExit(); code != 0 {
		t.Fatalf("plan with a stopped machine wants changes:\n%s", out)
	}
	w.must("apply", "-input=false", "-auto-approve", "-refresh-only")
	if ms := w.machines(); ms[1]["state"] != "stopped" {
		t.Errorf("refreshed state of the stopped machine: %v", ms[1]["state"])
	}

	// Tags change in place: same machines, same processes.
	w.write(machinesTF(endpoint, token, `{ team = "b", `+kloudTags+` }`))
	code, out := w.planExit()
	if code != 2 || !strings.Contains(out, "2 to change, 0 to destroy") {
		t.Fatalf("plan of a tag change:\n%s", out)
	}
	w.must("apply", "-input=false", "-auto-approve")
	for i, in := range infos {
		got, err := h.Manager.Info(t.Context(), in.ID)
		if err != nil || !maps.Equal(got.Tags, map[string]string{"team": "b", "kloud_stack": "s1", "kloud_machine": fmt.Sprintf("m%d", i)}) {
			t.Errorf("machine %s after the tag change: %+v %v", in.ID, got, err)
		}
		if in.ID == infos[0].ID && got.PID != in.PID {
			t.Errorf("machine %s restarted by a tag change: pid %d, was %d", in.ID, got.PID, in.PID)
		}
	}

	// A machine that vanished is planned again.
	if err := h.Manager.Destroy(t.Context(), infos[0].ID); err != nil {
		t.Fatal(err)
	}
	code, out = w.planExit()
	if code != 2 || !strings.Contains(out, "kloudlocal_machine.web[0] will be created") || !strings.Contains(out, "1 to add, 0 to change, 0 to destroy") {
		t.Fatalf("plan after a machine vanished:\n%s", out)
	}
	w.must("apply", "-input=false", "-auto-approve")
	ms = w.machines()
	infos[0], _ = h.Manager.Info(t.Context(), ms[0]["id"].(string))
	if infos[0].State != sandbox.StateRunning {
		t.Fatalf("re-created machine: %+v", infos[0])
	}

	t0 = time.Now()
	w.must("destroy", "-input=false", "-auto-approve")
	t.Logf("destroy of 2 machines: %s", time.Since(t0).Round(time.Millisecond))
	for _, in := range infos {
		h.AssertGone(t, in)
	}
	if left, _ := h.Manager.List(t.Context()); len(left) != 0 {
		t.Errorf("machines left after destroy: %+v", left)
	}
}

// Bad arguments are reported at plan time, before any machine exists; this needs neither root
// nor a machine network (validation does not configure the provider).
func TestValidation(t *testing.T) {
	w := newWorkdir(t, `
terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}
resource "kloudlocal_machine" "bad" {
  hostname = "under_score"
  memory   = 8
  cpus     = 0.001
  disk_mb  = 10
}
`)
	out, err := w.run("validate")
	if err == nil {
		t.Fatalf("validate accepted bad arguments:\n%s", out)
	}
	for _, want := range []string{"kloudlocal: bad hostname", "kloudlocal: memory too small", "kloudlocal: cpus too small", "kloudlocal: disk too small"} {
		if !strings.Contains(out, want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
}

// Without kloud's configuration the provider validates and plans new machines but does nothing
// to a machine; with a token of another stack kloud refuses the create: nothing is made.
func TestRefused(t *testing.T) {
	h := tfprovidertest.NewHost(t)
	endpoint, l := service(t, h)
	w := newWorkdir(t, `terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}
resource "kloudlocal_machine" "m" {
  hostname = "m"
  tags     = { kloud_stack = "s1", kloud_machine = "m0" }
}
`)
	if out, err := w.run("plan", "-input=false"); err != nil || !strings.Contains(out, "1 to add") {
		t.Fatalf("plan without endpoint and token: %v\n%s", err, out)
	}
	out, err := w.run("apply", "-input=false", "-auto-approve")
	if err == nil || !strings.Contains(out, "has no endpoint and token") {
		t.Errorf("apply without endpoint and token: %v\n%s", err, out)
	}
	other, err := l.Token("s2", []string{"m0"})
	if err != nil {
		t.Fatal(err)
	}
	w.write(providerBlock(endpoint, other) + `
resource "kloudlocal_machine" "m" {
  hostname = "m"
  tags     = { kloud_stack = "s1", kloud_machine = "m0" }
}
`)
	out, err = w.run("apply", "-input=false", "-auto-approve")
	if err == nil || !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "stack s2 only") {
		t.Errorf("apply with another stack's token: %v\n%s", err, out)
	}
	if strings.Contains(out, other) {
		t.Errorf("terraform printed the token:\n%s", out)
	}
	if left, _ := h.Manager.List(t.Context()); len(left) != 0 {
		t.Errorf("refused applies made machines: %+v", left)
	}
}
