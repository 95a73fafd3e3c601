package e2e

// End-to-end tests of the local provider: real namespace machines with real cloud-init, built
// by real terraform (the kloudlocal provider built from this tree) through the kloud CLI. Each
// test has its own kloud, data dir, terraformer process, bridge, 10.200.N.0/24 and machine state
// dir (tfprovidertest.NewHost), and everything it made is removed when it ends, also on failure.
// They need root; outside CI they skip loudly, under CI=true they fail.

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/local"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/userdata"
)

// localEnv is a kloud whose local provider works on a private Host, with a terraformer of its
// own (a process apart from kloud, so it survives a SIGKILL of kloud, and on a free port: the
// terraformer kloud serve starts by itself always takes 127.0.0.1:7001).
type localEnv struct {
	*env
	h *tfprovidertest.Host
}

func newLocalEnv(t *testing.T, extra ...string) *localEnv {
	t.Helper()
	h := tfprovidertest.NewHost(t) // gates on root, ip, nsenter, the base image; removes it all at the end
	return newLocalEnvOn(t, h, extra...)
}

// newLocalEnvOn is a kloud (own data dir and terraformer) whose local machines live on h, which
// other klouds of the test may share.
func newLocalEnvOn(t *testing.T, h *tfprovidertest.Host, extra ...string) *localEnv {
	t.Helper()
	testutil.RequireBinary(t, "curl")
	_, port, _ := net.SplitHostPort(testutil.FreeLoopback(t))
	// kloud listens on the bridge address only: the machines reach it there, and so do the CLI
	// and terraformer (the bridge is ours; kloud creates it before it listens).
	addr := net.JoinHostPort(h.HostAddr().String(), port)
	e := newTerraformerEnv(t, addr, kloudlocalMirror(t), append([]string{"--public-url", "http://" + addr, "--no-demo",
		"--local-state-dir", h.StateDir, "--local-bridge", h.Bridge, "--local-subnet", h.Subnet.String()}, extra...)...)
	return &localEnv{env: e, h: h}
}

// kloudlocalMirror returns a Terraform CLI config whose only provider source is a private
// mirror holding the kloudlocal provider built from this tree (once per test process;
// TestMain removes it).
func kloudlocalMirror(t *testing.T) string {
	t.Helper()
	_, cfg := tfprovidertest.Terraform(t)
	return cfg
}

// localTemplate is a template of n kloudlocal machines named <name>-<i> with the given script.
func localTemplate(name string, n int, script string) string {
	return fmt.Sprintf(`terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

resource "kloudlocal_machine" %q {
  count     = %d
  hostname  = "%s-${count.index}"
  memory    = 512
  user_data = <<-EOT
%s
  EOT
}
`, name, n, name, indent(script))
}

func indent(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n")
}

// sandboxID is the machine's id in the sandbox library (kloudlocal_machine's id).
func (m machine) sandboxID() string { s, _ := m.Attributes["id"].(string); return s }

type kiteInfo struct {
	Kite struct{ ID, Name, Username, Hostname string }
}

// exec runs argv inside machine id and returns its trimmed output.
func (e *localEnv) exec(id string, argv ...string) string {
	e.t.Helper()
	out, err := e.h.Manager.Exec(e.t.Context(), id, argv...)
	if err != nil {
		e.t.Fatalf("in %s: %s", id, err)
	}
	return strings.TrimSpace(string(out))
}

// hostFootprint is what the host shows of the machines of one state dir: network namespaces,
// links, mounts and cgroups whose names carry the state dir's prefix ("kd-<hash of the state
// dir>-", host veths "kdh<hash>"), and the state dir's entries.
type hostFootprint struct {
	netns, links, mounts, cgroups, entries []string
}

func (f hostFootprint) empty() bool {
	return len(f.netns)+len(f.links)+len(f.mounts)+len(f.cgroups)+len(f.entries) == 0
}

// footprint looks at the host (ip netns list, ip link, /proc/self/mountinfo, the cgroup trees,
// the state dir) for anything of the given machines: their netns and veth names, their
// directories, and anything under the state dir's name prefix.
func (e *localEnv) footprint(infos []sandbox.Info) hostFootprint {
	t := e.t
	t.Helper()
	var names []string // every host-side name of these machines
	prefixes := map[string]bool{}
	for _, in := range infos {
		names = append(names, in.Netns, in.HostVeth, "kdp"+strings.TrimPrefix(in.HostVeth, "kdh"))
		if i := strings.LastIndexByte(in.Netns, '-'); i > 0 {
			prefixes[in.Netns[:i+1]] = true // kd-<mgr6>-: every machine of this state dir
		}
	}
	match := func(s string) bool {
		for _, n := range names {
			if n != "" && strings.Contains(s, n) {
				return true
			}
		}
		for p := range prefixes {
			if strings.Contains(s, p) {
				return true
			}
		}
		return strings.Contains(s, e.h.StateDir)
	}
	var f hostFootprint
	lines := func(name string, args ...string) []string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %s\n%s", name, strings.Join(args, " "), err, out)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	for _, l := range lines("ip", "netns", "list") {
		if match(l) {
			f.netns = append(f.netns, l)
		}
	}
	for _, l := range lines("ip", "-o", "link", "show") {
		if match(l) {
			f.links = append(f.links, l)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(mi), "\n") {
		if match(l) {
			f.mounts = append(f.mounts, l)
		}
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/kloud/kd-*")
	more, _ := filepath.Glob("/sys/fs/cgroup/kloud/kd-*")
	for _, cg := range append(cgs, more...) {
		if match(filepath.Base(cg)) {
			f.cgroups = append(f.cgroups, cg)
		}
	}
	// The state dir keeps only its lock file, the directories of per-machine locks and ledger
	// entries (Destroy removes a machine's lock file and entry) and the local machine service's key.
	err = filepath.WalkDir(e.h.StateDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == e.h.StateDir {
			return err
		}
		rel, _ := filepath.Rel(e.h.StateDir, p)
		if rel == ".lock" || rel == ".locks" || rel == ".ledger" || rel == local.KeyFile {
			return nil
		}
		f.entries = append(f.entries, rel)
		if d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// assertNothingLeft fails the test if the host still has anything of the machines.
func (e *localEnv) assertNothingLeft(infos []sandbox.Info) {
	e.t.Helper()
	if f := e.footprint(infos); !f.empty() {
		e.t.Errorf("left on the host after destroy:\n netns %q\n links %q\n mounts %q\n cgroups %q\n state dir entries %q", f.netns, f.links, f.mounts, f.cgroups, f.entries)
	}
	for _, in := range infos {
		e.h.AssertGone(e.t, in)
	}
}

// sandboxInfos returns the sandbox's view of every machine in the state dir (also machines
// kloud may not know about, e.g. from an apply it lost track of).
func (e *localEnv) sandboxInfos() []sandbox.Info {
	e.t.Helper()
	infos, err := e.h.Manager.List(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	return infos
}

func randomWord() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestLocalStack builds a stack of two local machines from a template through the kloud CLI and
// checks each machine from inside (its klient was downloaded from this kloud by cloud-init and
// runs from /opt/kloud/bin/klient, its hostname is the template's, cloud-init's output log
// exists); stops a machine (Stopped, agent gone, disk kept) and starts it again (Running, agent
// back, the file written before the stop still there); destroys the stack and checks from the
// host that nothing of it is left.
func TestLocalStack(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	tid := e.template(localTemplate("web", 2, `#!/bin/bash
echo "user script ran on $(hostname)" > /root/user-script-ran`))
	sid := e.createStack(tid)
	out := e.apply(sid)
	ms := e.machines(sid)
	kites := e.kites()
	klient, err := os.ReadFile(filepath.Join(bin, "klient"))
	if err != nil {
		t.Fatal(err)
	}
	klientSum := sha256.Sum256(klient)
	kloudURL := "http://" + e.addr
	for i := range 2 {
		label, hostname := fmt.Sprintf("web.%d", i), fmt.Sprintf("web-%d", i)
		m := ms[label]
		if m.State != "Running" || m.Agent.Status != "connected" || m.KiteID == "" {
			t.Fatalf("%s after apply: %+v", label, m)
		}
		if !strings.Contains(out, label+": agent connected") {
			t.Errorf("apply output does not say %s's agent connected:\n%s", label, out)
		}
		// Its agent is registered with kontrol under the template's hostname.
		k, ok := kites[m.KiteID]
		if !ok || k.Kite.Name != "klient" || k.Kite.Username != "alice" || k.Kite.Hostname != hostname {
			t.Errorf("%s: kite %s registered as %+v (found %v), want klient of alice on %s", label, m.KiteID, k.Kite, ok, hostname)
		}
		id := m.sandboxID()
		in, err := e.h.Manager.Info(t.Context(), id)
		if err != nil || in.State != sandbox.StateRunning {
			t.Fatalf("%s: sandbox %q: %+v %v", label, id, in, err)
		}
		if in.Tags[local.TagStack] != sid || in.Tags[local.TagMachine] != m.ID || in.IP.String() != m.IPAddress {
			t.Errorf("%s: sandbox tags %v, ip %s; kloud says stack %s, machine %s, ip %s", label, in.Tags, in.IP, sid, m.ID, m.IPAddress)
		}
		// Inside the machine.
		if got := e.exec(id, "hostname"); got != hostname {
			t.Errorf("%s: hostname %q, want %q", label, got, hostname)
		}
		marks := userdata.ParseMarkers([]byte(e.exec(id, "cat", userdata.ProvisionLogPath)))
		var dlFrom string
		var dlOK, done bool
		for _, mk := range marks {
			switch {
			case mk.Step == userdata.StepDownload && mk.Status == userdata.StatusStart:
				dlFrom = mk.Detail
			case mk.Step == userdata.StepDownload && mk.Status == userdata.StatusOK:
				dlOK = true
			case mk.Step == userdata.StepDone && mk.Status == userdata.StatusOK:
				done = true
			}
		}
		if !dlOK || !done || dlFrom != kloudURL+"/dl/klient" {
			t.Errorf("%s: provision.log markers %+v: want download from %s/dl/klient ok and done ok", label, marks, kloudURL)
		}
		// The installed klient is the binary this kloud serves, and the agent runs from there.
		if got := strings.Fields(e.exec(id, "sha256sum", userdata.KlientPath)); len(got) == 0 || got[0] != hex.EncodeToString(klientSum[:]) {
			t.Errorf("%s: %s has sha256 %v, kloud serves %x", label, userdata.KlientPath, got, klientSum)
		}
		exes := strings.Fields(e.exec(id, "sh", "-c", `for p in /proc/[0-9]*; do readlink "$p/exe"; done; true`))
		if !slices.Contains(exes, userdata.KlientPath) {
			t.Errorf("%s: no process runs %s; executables: %q", label, userdata.KlientPath, exes)
		}
		if log := e.exec(id, "cat", userdata.CloudInitOutputPath); !strings.Contains(log, "Cloud-init v.") || !strings.Contains(log, "KLOUD-PROVISION step=done status=ok") {
			t.Errorf("%s: %s does not show cloud-init and the provisioning:\n%s", label, userdata.CloudInitOutputPath, log)
		}
		if got := e.exec(id, "cat", "/root/user-script-ran"); got != "user script ran on "+hostname {
			t.Errorf("%s: user script wrote %q", label, got)
		}
	}

	// Stop web.0: its disk keeps a file written before.
	m0 := ms["web.0"]
	id0 := m0.sandboxID()
	word := randomWord()
	e.exec(id0, "sh", "-c", "echo "+word+" > /root/kept && sync")
	e.run("machine", "stop", "web.0", "--stack", sid)
	if m := e.machines(sid)["web.0"]; m.State != "Stopped" || m.Agent.Status != "disconnected" {
		t.Fatalf("web.0 after stop: %+v", m)
	}
	if m := e.machines(sid)["web.1"]; m.State != "Running" || m.Agent.Status != "connected" {
		t.Errorf("web.1 after stopping web.0: %+v", m)
	}
	in0, err := e.h.Manager.Info(t.Context(), id0)
	if err != nil || in0.State != sandbox.StateStopped {
		t.Fatalf("web.0's sandbox after stop: %+v %v", in0, err)
	}
	// kontrol drops the kite when its connection closes, which may be a moment after the job.
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, ok := e.kites()[m0.KiteID]
		return !ok
	}, "web.0's kite %s is still registered after stop", m0.KiteID)
	if b, err := os.ReadFile(filepath.Join(in0.Dir, "upper", "root", "kept")); err != nil || strings.TrimSpace(string(b)) != word {
		t.Errorf("web.0's disk while stopped: /root/kept = %q, %v; want %q", b, err, word)
	}

	e.run("machine", "start", "web.0", "--stack", sid)
	if m := e.machines(sid)["web.0"]; m.State != "Running" || m.Agent.Status != "connected" {
		t.Fatalf("web.0 after start: %+v", m)
	}
	if k, ok := e.kites()[m0.KiteID]; !ok || k.Kite.Hostname != "web-0" {
		t.Errorf("web.0's kite %s after start: %+v (registered %v)", m0.KiteID, k, ok)
	}
	if got := e.exec(id0, "cat", "/root/kept"); got != word {
		t.Errorf("web.0 after start: /root/kept = %q, want %q", got, word)
	}
	if got := e.exec(id0, "hostname"); got != "web-0" {
		t.Errorf("web.0 after start: hostname %q", got)
	}

	// Destroy: nothing of the stack is left on the host.
	infos := e.sandboxInfos()
	if len(infos) != 2 {
		t.Fatalf("sandbox machines before destroy: %+v", infos)
	}
	if f := e.footprint(infos); len(f.netns) != 2 || len(f.links) != 2 || len(f.mounts) != 2 || len(f.entries) < 2 {
		t.Fatalf("the footprint check does not see the machines before destroy: %+v", f)
	}
	e.run("stack", "destroy", sid)
	if ms := e.machines(sid); len(ms) != 0 {
		t.Errorf("machines left in kloud: %+v", ms)
	}
	e.assertNothingLeft(infos)
}

// TestLocalUserScriptFails builds a machine whose user script fails: the build's job fails with
// the script's exit code and the tail of its output, the machine's reason says the same (its
// state is what the sandbox says: it runs, with its agent, so the user can look at it), and the
// stack's reason counts it as not ready.
func TestLocalUserScriptFails(t *testing.T) {
	parallel(t)
	e := newLocalEnv(t)
	e.alice()
	tid := e.template(localTemplate("bad", 1, `#!/bin/bash
for i in $(seq 1 300); do echo "noise line $i"; done
echo "LAST-WORDS: cannot open /nonexistent/config" >&2
exit 3`))
	sid := e.createStack(tid)
	out, err := e.try("stack", "apply", sid)
	if err == nil {
		t.Fatalf("apply of a failing user script succeeded:\n%s", out)
	}
	// The error carries the tail, not the head, of the script's output.
	checkTail := func(what, s string) {
		t.Helper()
		if !strings.Contains(s, "user script failed (exit code 3)") || !strings.Contains(s, "noise line 300\n") ||
			!strings.Contains(s, "LAST-WORDS: cannot open /nonexistent/config") || strings.Contains(s, "noise line 1\n") {
			t.Errorf("%s does not carry the exit code and the output's tail:\n%s", what, s)
		}
	}
	checkTail("the CLI's output", out)
	var jobs []struct{ ID, Kind, Status, Error string }
	e.runJSON(&jobs, "job", "list", "--target", "stack/"+sid)
	if len(jobs) == 0 || jobs[0].Kind != "stack.apply" || jobs[0].Status != "failed" {
		t.Fatalf("jobs of the stack: %+v", jobs)
	}
	checkTail("the job's error", jobs[0].Error)
	m := e.machines(sid)["bad.0"]
	if !strings.HasPrefix(m.Reason, "user script failed: ") {
		t.Errorf("machine reason %q does not say the user script failed", m.Reason)
	}
	checkTail("the machine's reason", m.Reason)
	if m.State != "Running" {
		t.Errorf("machine state %q, want Running (it runs; its reason says the script failed)", m.State)
	}
	var st struct{ State, Reason string }
	e.runJSON(&st, "stack", "describe", sid)
	if st.State != "Initialized" || st.Reason != "1 of 1 machines are not ready" {
		t.Errorf("stack: %+v", st)
	}
	// The machine says the same from inside.
	id := m.sandboxID()
	var us userdata.UserScriptStatus
	if got := e.exec(id, "cat", userdata.UserScriptStatusPath); json.Unmarshal([]byte(got), &us) != nil ||
		us.State != userdata.UserScriptFailed || us.ExitCode == nil || *us.ExitCode != 3 {
		t.Errorf("%s: %s", userdata.UserScriptStatusPath, got)
	}
	infos := e.sandboxInfos()
	e.run("stack", "destroy", sid)
	e.assertNothingLeft(infos)
}

// TestLocalTwoKlouds runs two klouds with separate data dirs on one host, sharing the machines'
// state dir, bridge and subnet (as two klouds with the defaults do): each restart's startup tidy
// and each kloud's gc leave the other kloud's running machines alone, and each machine records its kloud's instance.
func TestLocalTwoKlouds(t *testing.T) {
	parallel(t)
	h := tfprovidertest.NewHost(t)
	a := newLocalEnvOn(t, h)
	a.alice()
	sa := a.createStack(a.template(localTemplate("a", 1, "#!/bin/bash\necho a")))
	a.apply(sa)
	idA := a.machines(sa)["a.0"].sandboxID()

	b := newLocalEnvOn(t, h) // its startup tidy runs: kloud A's machine is not its
	b.alice()
	inA, err := h.Manager.Info(t.Context(), idA)
	if err != nil || inA.State != sandbox.StateRunning {
		t.Fatalf("kloud A's machine after kloud B started: %+v %v\nkloud B:\n%s", inA, err, b.kloudOut)
	}
	sb := b.createStack(b.template(localTemplate("b", 1, "#!/bin/bash\necho b")))
	b.apply(sb)
	idB := b.machines(sb)["b.0"].sandboxID()
	inB, _ := h.Manager.Info(t.Context(), idB)
	if inA.Instance == "" || inB.Instance == "" || inA.Instance == inB.Instance {
		t.Fatalf("instances of the machines: A %q, B %q", inA.Instance, inB.Instance)
	}

	// Restarts tidy again, and kloud gc collects, each knowing only its own stacks.
	for _, e := range []*localEnv{a, b} {
		e.kill()
		e.start()
		e.gc()
	}
	for id, who := range map[string]string{idA: "A", idB: "B"} {
		if in, err := h.Manager.Info(t.Context(), id); err != nil || in.State != sandbox.StateRunning {
			t.Errorf("kloud %s's machine after both klouds restarted: %+v %v", who, in, err)
		}
	}
	if m := a.machines(sa)["a.0"]; m.State != "Running" {
		t.Errorf("kloud A's machine: %+v", m)
	}
	if m := b.machines(sb)["b.0"]; m.State != "Running" {
		t.Errorf("kloud B's machine: %+v", m)
	}
	infos := a.sandboxInfos()
	a.run("stack", "destroy", sa)
	b.run("stack", "destroy", sb)
	a.assertNothingLeft(infos)
}
