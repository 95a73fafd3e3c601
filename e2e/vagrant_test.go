package e2e

// End-to-end tests of the vagrant provider, Koding's way: a kloud (its own data dir and
// terraformer), the kloudvagrant Terraform provider built from this tree, and alice's own
// vagrant host — the klient binary run with --vagrant and alice's kite key, driving the real
// vagrant with its docker provider against a private dockerd (package providers/docker/dockertest). The machines'
// own klients come from cloud-init and register with kloud like every machine's. They need root,
// vagrant and dockerd; outside CI they skip loudly, under CI=true they fail.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/userdata"
)

const vagrantImage = "kloud-vagrant-e2e:1"

type vagrantEnv struct {
	*env
	d     *dockertest.Daemon
	home  string // the host klient's vagrant home
	hostK *exec.Cmd
}

// kloudvagrantMirror returns a Terraform CLI config whose only provider source is a private
// mirror holding the kloudvagrant provider built from this tree (once per test process;
// TestMain removes it).
func kloudvagrantMirror(t *testing.T) string {
	t.Helper()
	_, cfg := tfprovidertest.Terraform(t)
	return cfg
}

// newVagrantEnv starts a private dockerd with the base image, a kloud with its own terraformer,
// user alice, and alice's vagrant host (bin/klient --vagrant with her kite key).
func newVagrantEnv(t *testing.T) *vagrantEnv { return newVagrantEnvUsers(t, (*env).alice) }

// newVagrantEnvUsers is newVagrantEnv with users added by users, which must add alice and set
// e.key to her kite key (the host klient's).
func newVagrantEnvUsers(t *testing.T, users func(e *env)) *vagrantEnv {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "terraform")
	testutil.RequireBinary(t, "vagrant")
	d := dockertest.New(t)
	d.Import(t, vagrantImage)
	addr := testutil.FreeLoopback(t)
	e := newTerraformerEnv(t, addr, kloudvagrantMirror(t), "--public-url", "http://"+addr, "--no-demo")
	users(e)
	ve := &vagrantEnv{env: e, d: d, home: t.TempDir()}
	ve.startHost()
	// Last cleanup to run first: nothing of the machines is left in docker.
	t.Cleanup(func() {
		for _, c := range d.Containers(t) {
			t.Errorf("container %s left behind", c)
			d.Docker(t, "rm", "-f", c)
		}
	})
	return ve
}

// startHost runs alice's host klient until the test ends and waits until kloud sees it.
func (e *vagrantEnv) startHost() {
	t := e.t
	cmd := exec.Command(filepath.Join(bin, "klient"), "--vagrant", "--kite-key", e.key,
		"--vagrant-home", e.home, "--state-dir", filepath.Join(e.home, "state"))
	cmd.Env = append(os.Environ(), e.d.Env())
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("host klient output:\n%s", out)
		}
	})
	e.hostK = cmd
	testutil.Eventually(t, 30*time.Second, func() bool {
		for _, k := range e.kites() {
			if k.Kite.Name == "klient-vagrant" {
				return true
			}
		}
		return false
	}, "alice's vagrant host did not register:\n%s", out)
}

// container is the docker container of the vagrant machine named name on the host.
func (e *vagrantEnv) container(name string) string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "machines", name, ".vagrant", "machines", "default", "docker", "id"))
	if err != nil {
		e.t.Fatalf("vagrant machine %s: no container id: %v", name, err)
	}
	return strings.TrimSpace(string(b))
}

func (e *vagrantEnv) exec(container string, argv ...string) string {
	e.t.Helper()
	return strings.TrimSpace(e.d.Docker(e.t, append([]string{"exec", container}, argv...)...))
}

func vagrantTemplate(name string, n int, script string) string {
	return fmt.Sprintf(`terraform {
  required_providers {
    kloudvagrant = { source = "kloud/kloudvagrant" }
  }
}

resource "kloudvagrant_machine" %q {
  count     = %d
  hostname  = "%s-${count.index}"
  image     = %q
  memory    = 512
  cpus      = 1
  user_data = <<-EOT
%s
  EOT
}
`, name, n, name, vagrantImage, indent(script))
}

// TestVagrantStack builds a stack of two vagrant machines on alice's host through the kloud CLI:
// both Running with their agents connected (downloaded from kloud by cloud-init, registered as
// alice's), cloud-init's log in place; stops a machine (disk kept) and starts it again; destroys
// the stack and checks that Vagrant and docker have nothing left.
func TestVagrantStack(t *testing.T) {
	parallel(t)
	e := newVagrantEnv(t)
	tid := e.template(vagrantTemplate("web", 2, `#!/bin/bash
echo "user script ran on $(hostname)" > /root/user-script-ran`))
	sid := e.createStack(tid)
	t0 := time.Now()
	e.apply(sid)
	t.Logf("2 vagrant machines Running with agents in %s", time.Since(t0).Round(time.Millisecond))
	ms := e.machines(sid)
	kites := e.kites()
	for i := range 2 {
		label, hostname := fmt.Sprintf("web.%d", i), fmt.Sprintf("web-%d", i)
		m := ms[label]
		if m.State != "Running" || m.Agent.Status != "connected" || m.KiteID == "" {
			t.Fatalf("%s after apply: %+v", label, m)
		}
		if k, ok := kites[m.KiteID]; !ok || k.Kite.Name != "klient" || k.Kite.Username != "alice" || k.Kite.Hostname != hostname {
			t.Errorf("%s: kite %s registered as %+v (found %v), want klient of alice on %s", label, m.KiteID, k.Kite, ok, hostname)
		}
		c := e.container(m.sandboxID())
		if log := e.exec(c, "cat", userdata.CloudInitOutputPath); !strings.Contains(log, "Cloud-init v.") || !strings.Contains(log, "KLOUD-PROVISION step=done status=ok") {
			t.Errorf("%s: %s does not show cloud-init and the provisioning:\n%s", label, userdata.CloudInitOutputPath, log)
		}
		if got := e.exec(c, "cat", "/root/user-script-ran"); got != "user script ran on "+hostname {
			t.Errorf("%s: user script wrote %q", label, got)
		}
	}

	// Stop web.0 and start it again: the file written before is still there.
	m0 := ms["web.0"]
	c0 := e.container(m0.sandboxID())
	e.stopStartKeepsFile(sid, "web.0", func(argv ...string) string { return e.exec(c0, argv...) }, func(m machine) {
		if m.Agent.Status != "disconnected" {
			t.Errorf("web.0's agent after stop: %+v", m)
		}
		if st := strings.TrimSpace(e.d.Docker(t, "inspect", "--format", "{{.State.Status}}", c0)); st != "exited" {
			t.Errorf("web.0's container after stop: %s", st)
		}
	})

	e.run("stack", "destroy", sid)
	if ms := e.machines(sid); len(ms) != 0 {
		t.Errorf("machines left in kloud: %+v", ms)
	}
	if c := e.d.Containers(t); len(c) != 0 {
		t.Errorf("containers after destroy: %v", c)
	}
	gs := exec.Command("vagrant", "global-status", "--prune")
	gs.Env = append(os.Environ(), "VAGRANT_HOME="+filepath.Join(e.home, "vagrant.d"), "VAGRANT_CHECKPOINT_DISABLE=1", e.d.Env())
	if out, err := gs.CombinedOutput(); err != nil || !strings.Contains(string(out), "no active Vagrant environments") {
		t.Errorf("vagrant global-status --prune after destroy: %v\n%s", err, out)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.home, "machines")); len(ents) != 0 {
		t.Errorf("machine directories left on the host: %v", ents)
	}
}

// TestVagrantKloudKilledMidBuild SIGKILLs kloud while a vagrant stack builds (terraformer and
// alice's host klient run on), once while terraform creates the machines and once while kloud
// waits for the agents, and starts it again: the interrupted job ends (built, or failed with a
// reason), no machine stays Building, and after destroy neither Vagrant nor docker has anything
// left (what an interrupted create left is swept when the host reconnects).
func TestVagrantKloudKilledMidBuild(t *testing.T) {
	parallel(t)
	for _, tc := range []struct {
		name    string
		percent int
	}{
		{"during terraform", 40},
		{"while waiting for agents", 70},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newVagrantEnv(t)
			sid := e.createStack(e.template(vagrantTemplate("k", 2, "#!/bin/bash\necho working; sleep 3; echo done")))
			_, j := e.killMidBuild(sid, tc.percent, 3*time.Minute)
			e.checkResumedBuild(sid, 2, j)
			e.run("stack", "destroy", sid)
			testutil.Eventually(t, 3*time.Minute, func() bool {
				ents, _ := os.ReadDir(filepath.Join(e.home, "machines"))
				return len(e.d.Containers(t)) == 0 && len(ents) == 0
			}, "left after destroy: containers %v, host dirs under %s", e.d.Containers(t), filepath.Join(e.home, "machines"))
		})
	}
}

// TestBrowserVagrantTerminal is the browser terminal into a vagrant machine (a container made by
// alice's own klient --vagrant, its agent and alice's account made by cloud-init): alice builds a
// one-machine vagrant stack in the UI, opens its terminal, types and reads the answer, reloads
// and sees the session replayed; bob, with a read-only share, watches; kloud is killed and
// restarted and the terminal reattaches (e2e/browser/ui.mjs, as TestBrowserTerminal).
func TestBrowserVagrantTerminal(t *testing.T) {
	node, script, out := browserPrereqs(t)
	var password string
	ve := newVagrantEnvUsers(t, func(e *env) {
		password = browserUsers(t, e)
		key := filepath.Join(e.dir, "alice.key")
		e.run("key", "create", "--username", "alice", "--out", key)
		e.key = key
	})
	runUI(t, ve.env, node, script, out, "KLOUD_PASSWORD="+password, "KLOUD_TERMINAL=1", "KLOUD_RESTART=1",
		"KLOUD_SHARE_USER=bob", "KLOUD_SHARE_PASSWORD="+password,
		"KLOUD_CREDENTIAL=0", "KLOUD_PROVIDER=vagrant", "KLOUD_MACHINE=dev.0",
		"KLOUD_TEMPLATE="+vagrantTemplate("dev", 1, "#!/bin/bash\necho ready"))
	for _, f := range []string{"terminal.png", "terminal-after-reload.png", "readonly-watcher.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
	}
	// The UI built a stack; destroy it so the machine's container goes (the cleanup checks).
	var stacks []struct{ ID string }
	ve.runJSON(&stacks, "stack", "list")
	for _, s := range stacks {
		ve.run("stack", "destroy", s.ID)
	}
}

// TestVagrantBootMeasure is a measurement, not a check (bench/RESULTS.md, "Vagrant boot"): for 1
// and 10 machines, `stack apply` of a vagrant stack until the job succeeded (every agent
// registered, pinged, provisioned), against raw Vagrant on the same machines: the machines'
// directories kloud's build left on the host (Vagrantfile, kloud.json, the NoCloud seed with the
// agents' keys) are destroyed with `vagrant destroy -f`, then `vagrant up` runs in all of them at
// once, timed until the same kite ids have registered again (seen through `kloud kites`, polled
// every 250 ms). It runs only with KLOUD_MEASURE=1.
func TestVagrantBootMeasure(t *testing.T) {
	if os.Getenv("KLOUD_MEASURE") != "1" {
		t.Skip("a measurement: run it with KLOUD_MEASURE=1 (bench/RESULTS.md)")
	}
	e := newVagrantEnv(t)
	vagrantIn := func(name string, args ...string) error {
		cmd := exec.Command("vagrant", args...)
		cmd.Dir = filepath.Join(e.home, "machines", name)
		cmd.Env = append(os.Environ(), "VAGRANT_HOME="+filepath.Join(e.home, "vagrant.d"), "VAGRANT_CHECKPOINT_DISABLE=1",
			"VAGRANT_EXPERIMENTAL=cloud_init", e.d.Env())
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("vagrant %s in %s: %w: %s", strings.Join(args, " "), name, err, out)
		}
		return nil
	}
	all := func(names []string, args ...string) {
		errs := make(chan error, len(names))
		for _, n := range names {
			go func() { errs <- vagrantIn(n, args...) }()
		}
		for range names {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	// KLOUD_MEASURE_N (default "1,10") and KLOUD_MEASURE_ROUNDS (default 1): which sizes, how
	// many builds of each.
	ns, rounds := []int{1, 10}, 1
	if v := os.Getenv("KLOUD_MEASURE_N"); v != "" {
		ns = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				t.Fatalf("KLOUD_MEASURE_N=%q: want positive integers", v)
			}
			ns = append(ns, n)
		}
	}
	if v := os.Getenv("KLOUD_MEASURE_ROUNDS"); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			t.Fatalf("KLOUD_MEASURE_ROUNDS=%q: want a positive integer", v)
		}
	}
	var sizes []int
	for _, n := range ns {
		for range rounds {
			sizes = append(sizes, n)
		}
	}
	for round, n := range sizes {
		sid := e.createStack(e.template(vagrantTemplate(fmt.Sprintf("b%d%c", n, 'a'+round), n, "#!/bin/bash\necho ok")))
		t0 := time.Now()
		e.apply(sid)
		kloudT := time.Since(t0)
		var names, kites []string
		for _, m := range e.machines(sid) {
			names, kites = append(names, m.sandboxID()), append(kites, m.KiteID)
		}
		all(names, "destroy", "-f")
		every(t, time.Minute, func() bool {
			ks := e.kites()
			for _, id := range kites {
				if _, ok := ks[id]; ok {
					return false
				}
			}
			return true
		}, "agents still registered after vagrant destroy")
		t1 := time.Now()
		all(names, "up", "--provider=docker")
		every(t, 5*time.Minute, func() bool {
			ks := e.kites()
			for _, id := range kites {
				if _, ok := ks[id]; !ok {
					return false
				}
			}
			return true
		}, "agents did not register after raw vagrant up")
		rawT := time.Since(t1)
		limit := time.Duration(float64(rawT)*1.1) + 500*time.Millisecond
		load, _ := os.ReadFile("/proc/loadavg")
		t.Logf("MEASURE vagrant N=%d (build %d, load %s): kloud stack apply (job done) %s; raw vagrant up + agents registered %s; ratio %.2f×; limit 1.10× + 0.5 s = %s (%s)",
			n, round+1, strings.Join(strings.Fields(string(load))[:3], " "), kloudT.Round(10*time.Millisecond), rawT.Round(10*time.Millisecond), float64(kloudT)/float64(rawT), limit.Round(10*time.Millisecond),
			map[bool]string{true: "met", false: "missed"}[kloudT <= limit])
		e.run("stack", "destroy", sid)
	}
}

// every polls cond every 250 ms (each poll runs the CLI) until it holds, or fails the test.
func every(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
