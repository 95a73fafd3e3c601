package klient_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/kontrol"
	"github.com/kloud-dev/kloud/kontrol/kontroltest"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
)

// vagrantHost is a real kontrol, a private dockerd with the Debian base image, and a klient
// --vagrant of alice's registered with kontrol, driving the real vagrant with its docker provider.
type vagrantHost struct {
	t      *testing.T
	ko     *kontroltest.Env
	d      *dockertest.Daemon
	kiteID string
	home   string
	conn   *kite.Conn // kontrol's end of the host klient's registration
	info   kontrol.KiteInfo
}

const vagrantImage = "kloud-vagrant-test:1"

func startVagrantHost(t *testing.T, image bool) *vagrantHost {
	t.Helper()
	testutil.RequireBinary(t, "vagrant")
	d := dockertest.New(t)
	if image {
		d.Import(t, vagrantImage)
	}
	h := &vagrantHost{t: t, ko: kontroltest.Start(t, kontroltest.Options{}), d: d, home: t.TempDir()}
	keyFile, id := h.ko.KeyFile("alice")
	h.kiteID = id
	ready := make(chan kontrol.RegisterResult, 1)
	kl, err := klient.New(klient.Options{
		KiteKeyFile: keyFile, KontrolURL: h.ko.URL(), StateDir: t.TempDir(), Logger: testutil.Logger(t),
		Vagrant: &klient.VagrantOptions{Home: h.home, Env: []string{d.Env()}},
		Ready: func(r kontrol.RegisterResult) {
			select {
			case ready <- r:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); kl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case r := <-ready:
		h.info = r.Kite
	case <-time.After(wait):
		t.Fatal("klient --vagrant did not register")
	}
	h.conn = h.ko.Kontrol.Conn(id)
	// Whatever a failing test left: no container survives it.
	t.Cleanup(func() {
		for _, c := range d.Containers(t) {
			t.Errorf("container %s left behind", c)
			d.Docker(t, "rm", "-f", c)
		}
	})
	return h
}

func (h *vagrantHost) token(user string) string {
	h.t.Helper()
	tok, err := h.ko.Kontrol.Signer().Token(user, h.kiteID, 10*time.Minute)
	if err != nil {
		h.t.Fatal(err)
	}
	return tok
}

func (h *vagrantHost) call(method string, params, result any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return h.conn.Call(ctx, method, params, result)
}

func (h *vagrantHost) must(method string, params, result any) {
	h.t.Helper()
	t0 := time.Now()
	if err := h.call(method, params, result); err != nil {
		h.t.Fatalf("%s: %v", method, err)
	}
	h.t.Logf("%s took %s", method, time.Since(t0).Round(time.Millisecond))
}

// exec runs a command in the machine's container.
func (h *vagrantHost) exec(id string, args ...string) (string, error) {
	cmd := exec.Command("docker", append([]string{"exec", id}, args...)...)
	cmd.Env = append(os.Environ(), h.d.Env())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A host klient runs the whole life of a docker machine through Vagrant: create (the NoCloud
// seed reaches cloud-init), up, halt and up again (the disk stays), list, destroy (nothing left).
func TestVagrantHostMachineLifecycle(t *testing.T) {
	h := startVagrantHost(t, true)
	if h.info.Kite.Name != klientapi.VagrantHostName || h.info.Kite.Username != "alice" {
		t.Fatalf("registered as %s, want name %s of alice", h.info.Kite, klientapi.VagrantHostName)
	}
	tok := h.token("alice")
	userData := "#cloud-config\nwrite_files:\n - path: /root/from-seed\n   content: seeded by kloud\nruncmd:\n - [sh, -c, 'hostname > /root/hostname']\n"
	create := klientapi.VagrantCreateParams{Token: tok, Name: "m1", Image: vagrantImage, Hostname: "web-1", MemoryMB: 256, CPUs: 1, UserData: userData}
	var vm klientapi.VagrantMachine
	h.must(klientapi.MethodVagrantCreate, create, &vm)
	if vm.State != klientapi.VagrantNotCreated || vm.Provider != "docker" || vm.Dir != filepath.Join(h.home, "machines", "m1") {
		t.Fatalf("created %+v", vm)
	}
	// The Vagrantfile holds no parameter; the seed is in place.
	vf, _ := os.ReadFile(filepath.Join(vm.Dir, "Vagrantfile"))
	if strings.Contains(string(vf), vagrantImage) || strings.Contains(string(vf), "web-1") {
		t.Errorf("the Vagrantfile contains a parameter:\n%s", vf)
	}
	if b, _ := os.ReadFile(filepath.Join(vm.Dir, "seed", "user-data")); string(b) != userData {
		t.Errorf("seed user-data = %q", b)
	}
	// Again with the same parameters: nothing changes; with others: a conflict.
	h.must(klientapi.MethodVagrantCreate, create, &vm)
	other := create
	other.MemoryMB = 512
	if err := h.call(klientapi.MethodVagrantCreate, other, nil); !errors.Is(err, kite.ErrConflict) {
		t.Errorf("create with other parameters: %v, want a conflict", err)
	}

	h.must(klientapi.MethodVagrantUp, klientapi.VagrantNameParams{Token: tok, Name: "m1"}, &vm)
	if vm.State != klientapi.VagrantRunning || vm.ID == "" {
		t.Fatalf("after up: %+v", vm)
	}
	id := vm.ID
	// cloud-init ran on the seed: the file it wrote and the hostname from the meta-data.
	testutil.Eventually(t, 2*time.Minute, func() bool {
		out, err := h.exec(id, "cat", "/root/from-seed", "/root/hostname")
		return err == nil && strings.Contains(out, "seeded by kloud") && strings.Contains(out, "web-1")
	}, "cloud-init did not run the seed's user data")
	// Limits: memory and cpus reached docker.
	if out := h.d.Docker(t, "inspect", "--format", "{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.NetworkMode}}", id); strings.TrimSpace(out) != "268435456 1000000000 host" {
		t.Errorf("container limits/network: %q, want 256 MiB, 1 cpu, host", out)
	}
	if out, err := h.exec(id, "sh", "-c", "echo kept > /root/kept"); err != nil {
		t.Fatalf("write a file: %v: %s", err, out)
	}

	h.must(klientapi.MethodVagrantHalt, klientapi.VagrantNameParams{Token: tok, Name: "m1"}, &vm)
	if vm.State != klientapi.VagrantStopped {
		t.Fatalf("after halt: %+v", vm)
	}
	h.must(klientapi.MethodVagrantUp, klientapi.VagrantNameParams{Token: tok, Name: "m1"}, &vm)
	if vm.State != klientapi.VagrantRunning || vm.ID != id {
		t.Fatalf("after up again: %+v (container was %s)", vm, id)
	}
	if out, err := h.exec(id, "cat", "/root/kept"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Errorf("file after halt/up: %q, %v", out, err)
	}

	var list klientapi.VagrantListResult
	h.must(klientapi.MethodVagrantList, klientapi.VagrantListParams{Token: tok}, &list)
	if len(list.Machines) != 1 || list.Machines[0].Name != "m1" || list.Machines[0].State != klientapi.VagrantRunning {
		t.Errorf("list: %+v", list.Machines)
	}

	h.must(klientapi.MethodVagrantDestroy, klientapi.VagrantNameParams{Token: tok, Name: "m1"}, nil)
	if c := h.d.Containers(t); len(c) != 0 {
		t.Errorf("containers after destroy: %v", c)
	}
	if _, err := os.Stat(vm.Dir); !os.IsNotExist(err) {
		t.Errorf("machine dir after destroy: %v", err)
	}
	h.must(klientapi.MethodVagrantStatus, klientapi.VagrantNameParams{Token: tok, Name: "m1"}, &vm)
	if vm.State != klientapi.VagrantAbsent {
		t.Errorf("status after destroy: %+v", vm)
	}
	h.must(klientapi.MethodVagrantDestroy, klientapi.VagrantNameParams{Token: tok, Name: "m1"}, nil) // again: fine
	if err := h.call(klientapi.MethodVagrantUp, klientapi.VagrantNameParams{Token: tok, Name: "m1"}, nil); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("up of a destroyed machine: %v, want not found", err)
	}
}

// Only the owner may drive the host, and every parameter is checked before anything runs:
// names cannot leave the vagrant home, and nothing reaches Ruby source.
func TestVagrantHostRefuses(t *testing.T) {
	h := startVagrantHost(t, false)
	tok := h.token("alice")
	good := klientapi.VagrantCreateParams{Token: tok, Name: "m1", Image: vagrantImage}
	if err := h.call(klientapi.MethodVagrantCreate, withToken(good, h.token("bob")), nil); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("bob's token: %v, want permission denied", err)
	}
	if err := h.call(klientapi.MethodVagrantList, klientapi.VagrantListParams{}, nil); !errors.Is(err, kite.ErrInvalidParams) {
		t.Errorf("no token: %v, want invalid params", err)
	}
	// A token for another kite (alice's, but not this klient's) is refused.
	other, err := h.ko.Kontrol.Signer().Token("alice", "some-other-kite", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.call(klientapi.MethodVagrantList, klientapi.VagrantListParams{Token: other}, nil); err == nil {
		t.Error("a token for another kite was accepted")
	}
	bad := []func(p *klientapi.VagrantCreateParams){
		func(p *klientapi.VagrantCreateParams) { p.Name = "../../etc" },
		func(p *klientapi.VagrantCreateParams) { p.Name = "m1/x" },
		func(p *klientapi.VagrantCreateParams) { p.Name = "M1" },
		func(p *klientapi.VagrantCreateParams) { p.Image = `x"; system("touch /tmp/pwned"); "` },
		func(p *klientapi.VagrantCreateParams) { p.Image = "#{`id`}" },
		func(p *klientapi.VagrantCreateParams) { p.Image = "../x" },
		func(p *klientapi.VagrantCreateParams) { p.Box = "debian/bookworm64" },               // both
		func(p *klientapi.VagrantCreateParams) { p.Image = ""; p.Box = "a/b/c" },             // bad box
		func(p *klientapi.VagrantCreateParams) { p.Image = ""; p.Box = "x'; `id`" },          // bad box
		func(p *klientapi.VagrantCreateParams) { p.Hostname = "a\"+`id`+\"" },                // bad hostname
		func(p *klientapi.VagrantCreateParams) { p.Provider = "virtualbox" },                 // image needs docker
		func(p *klientapi.VagrantCreateParams) { p.MemoryMB = 8 },                            // too small
		func(p *klientapi.VagrantCreateParams) { p.CPUs = -1 },                               // negative
		func(p *klientapi.VagrantCreateParams) { p.UserData = strings.Repeat("x", 1<<20+1) }, // too big
	}
	for i, f := range bad {
		p := good
		f(&p)
		if err := h.call(klientapi.MethodVagrantCreate, p, nil); !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("case %d (%+v): %v, want invalid params", i, p, err)
		}
	}
	for _, name := range []string{"..", "../m1", ""} {
		if err := h.call(klientapi.MethodVagrantDestroy, klientapi.VagrantNameParams{Token: tok, Name: name}, nil); !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("destroy %q: %v, want invalid params", name, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(h.home, "machines")); len(ents) != 0 {
		t.Errorf("refused calls left machine dirs: %v", ents)
	}
}

func withToken(p klientapi.VagrantCreateParams, tok string) klientapi.VagrantCreateParams {
	p.Token = tok
	return p
}

// A machine's agent key cannot make a vagrant host: klient refuses to start with it, and kontrol
// refuses an agent key that registers under the host name.
func TestVagrantHostNeedsAKiteKey(t *testing.T) {
	testutil.RequireBinary(t, "vagrant")
	ko := kontroltest.Start(t, kontroltest.Options{})
	key, _ := ko.AgentKey("alice", "m1")
	keyFile := filepath.Join(t.TempDir(), "kite.key")
	if err := kitekey.WriteFile(keyFile, key); err != nil {
		t.Fatal(err)
	}
	_, err := klient.New(klient.Options{KiteKeyFile: keyFile, KontrolURL: ko.URL(), StateDir: t.TempDir(),
		Vagrant: &klient.VagrantOptions{Home: t.TempDir()}})
	if err == nil || !strings.Contains(err.Error(), "agent key") {
		t.Fatalf("klient --vagrant with an agent key: %v", err)
	}
	c, err := ko.DialKey(t.Context(), key, klientapi.VagrantHostName)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Call(t.Context(), "kontrol.register", map[string]any{}, nil); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("an agent key registering as %s: %v, want permission denied", klientapi.VagrantHostName, err)
	}
}
