package vagrant_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kontrol/kontroltest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/vagrant"
	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider"
	"github.com/kloud-dev/kloud/providers/vagrant/vagranttest"
)

// The vagrant machine service builds on the owner's real host klient (real vagrant, docker
// provider, private dockerd): create boots the machine, kloud stops, starts and inspects it
// through the host, delete leaves no container; another stack's or user's token gets nothing.
func TestServiceThroughHostKlient(t *testing.T) {
	ko := kontroltest.Start(t, kontroltest.Options{})
	keyFile, _ := ko.KeyFile("alice")
	host := vagranttest.Start(t, ko.URL(), keyFile)
	v, err := vagrant.New(vagrant.Options{StateDir: t.TempDir(), Hosts: vagrant.KontrolHosts(ko.Kontrol), Instance: "test", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(v.Provider().Handler)
	t.Cleanup(srv.Close)
	client := func(stack, owner string, machines ...string) *tfprovider.Client {
		tok, err := v.Token(stack, owner, machines)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tfprovider.NewClient(srv.URL, tok)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	alice := client("s1", "alice", "m1")
	tags := map[string]string{vagrant.TagStack: "s1", vagrant.TagMachine: "m1", "team": "a"}
	req := tfprovider.CreateRequest{Hostname: "web-0", Image: vagranttest.Image, MemoryMB: 256, CPUs: 1, Tags: tags,
		UserData: "#cloud-config\nruncmd:\n - [sh, -c, 'echo booted > /root/booted']\n"}

	// Refusals first: nothing may reach the host.
	if _, err := client("s1", "alice", "m2").Create(t.Context(), req); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("create of a machine the token does not list: %v", err)
	}
	bad := req
	bad.Hostname = "a;b"
	if _, err := alice.Create(t.Context(), bad); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("bad hostname: %v", err)
	}
	bobReq := req
	bobReq.Tags = map[string]string{vagrant.TagStack: "s9", vagrant.TagMachine: "m9"}
	if _, err := client("s9", "bob", "m9").Create(t.Context(), bobReq); err == nil || !strings.Contains(err.Error(), "no vagrant host connected") {
		t.Errorf("bob has no host: %v", err)
	}

	t0 := time.Now()
	m, err := alice.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("create took %s", time.Since(t0).Round(time.Millisecond))
	if m.State != "running" || m.Host != host.KiteID || !strings.HasPrefix(m.ID, "web-0-") {
		t.Fatalf("created %+v", m)
	}
	containers := host.Dockerd.Containers(t)
	if len(containers) != 1 {
		t.Fatalf("containers: %v", containers)
	}
	execIn := func(args ...string) (string, error) {
		cmd := exec.Command("docker", append([]string{"exec", containers[0]}, args...)...)
		cmd.Env = append(os.Environ(), host.Dockerd.Env())
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	testutil.Eventually(t, 2*time.Minute, func() bool {
		out, err := execIn("cat", "/root/booted")
		return err == nil && strings.TrimSpace(out) == "booted"
	}, "the user data did not run")

	// The Vagrantfile enforced memory and cpus (docker's cgroup limits).
	inspect := exec.Command("docker", "inspect", "--format", "{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}}", containers[0])
	inspect.Env = append(os.Environ(), host.Dockerd.Env())
	if out, err := inspect.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != fmt.Sprintf("%d %d", 256<<20, 1_000_000_000) {
		t.Errorf("container limits (memory bytes, nano cpus): %q %v, want 256 MiB and 1 CPU", out, err)
	}
	testConstraints(t, v)

	// Another stack's token (of alice too) neither reads nor deletes it.
	other := client("s2", "alice")
	if _, err := other.Read(t.Context(), m.ID); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("read with another stack's token: %v", err)
	}
	if err := other.Delete(t.Context(), m.ID); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("delete with another stack's token: %v", err)
	}

	// kloud's own operations, through the host.
	pm, err := v.Provider().Machine(&provider.BaseMachine{ID: "m1", Label: "web", Owner: "alice", Attributes: map[string]any{"id": m.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if st, _, err := pm.Info(t.Context()); err != nil || st != provider.Running {
		t.Fatalf("info: %v %v", st, err)
	}
	if _, err := execIn("sh", "-c", "echo kept > /root/kept"); err != nil {
		t.Fatal(err)
	}
	if _, err := pm.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, _, err := pm.Info(t.Context()); err != nil || st != provider.Stopped {
		t.Fatalf("info after stop: %v %v", st, err)
	}
	if _, err := pm.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if out, err := execIn("cat", "/root/kept"); err != nil || strings.TrimSpace(out) != "kept" {
		t.Errorf("file after stop/start: %q %v", out, err)
	}
	if _, err := v.Provider().Machine(&provider.BaseMachine{ID: "m1", Owner: "bob", Attributes: map[string]any{"id": m.ID}}); !errors.Is(err, kite.ErrPermission) {
		t.Errorf("bob's machine of alice's record: %v", err)
	}

	got, err := alice.Read(t.Context(), m.ID)
	if err != nil || got.State != "running" || got.Tags["team"] != "a" {
		t.Fatalf("read: %+v %v", got, err)
	}
	if err := alice.Delete(t.Context(), m.ID); err != nil {
		t.Fatal(err)
	}
	if c := host.Dockerd.Containers(t); len(c) != 0 {
		t.Errorf("containers after delete: %v", c)
	}
	if _, err := alice.Read(t.Context(), m.ID); !errors.Is(err, tfprovider.ErrNotFound) {
		t.Errorf("read after delete: %v", err)
	}
	if err := alice.Delete(t.Context(), m.ID); err != nil {
		t.Errorf("delete again: %v", err)
	}

	// The destroyed machine, as kloud builds it from a snapshot's record: its snapshots on its
	// host can still be deleted (an absent one is no error), nothing else; bob cannot reach
	// alice's host through it.
	gone, err := v.Provider().Machine(&provider.BaseMachine{ID: "m1", Label: "web", Owner: "alice", Attributes: map[string]any{"id": m.ID, "host": m.Host}})
	if err != nil {
		t.Fatalf("the destroyed machine: %v", err)
	}
	if err := gone.(provider.Snapshotter).DeleteSnapshot(t.Context(), "snap1"); err != nil {
		t.Errorf("delete a snapshot of the destroyed machine: %v", err)
	}
	if _, _, err := gone.Info(t.Context()); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("info of the destroyed machine: %v", err)
	}
	if err := gone.(provider.Snapshotter).Restore(t.Context(), "snap1"); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("restore into the destroyed machine: %v", err)
	}
	bobs, err := v.Provider().Machine(&provider.BaseMachine{ID: "m1", Owner: "bob", Attributes: map[string]any{"id": m.ID, "host": m.Host}})
	if err != nil {
		t.Fatal(err)
	}
	if err := bobs.(provider.Snapshotter).DeleteSnapshot(t.Context(), "snap1"); !errors.Is(err, kite.ErrUnavailable) {
		t.Errorf("bob's delete on alice's host: %v, want no host of bob's", err)
	}
}

// testConstraints: alice's stack is checked against her host's figures (vagrant.info), with
// the nearest valid value; bob, who has no host, against the provider's own limits.
func testConstraints(t *testing.T, v *vagrant.Vagrant) {
	p := v.Provider()
	if !p.Can(provider.CapConstraints) {
		t.Fatalf("capabilities %v: no constraints", p.Caps())
	}
	check := func(owner string, attrs map[string]any) error {
		st, err := p.Stack(&provider.BaseStack{Provider: p, Owner: owner, Log: testutil.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return st.(provider.ConstraintsValidator).ValidateConstraints(t.Context(), attrs)
	}
	cpus := runtime.NumCPU()
	err := check("alice", map[string]any{"cpus": float64(cpus + 1), "memory": float64(256)})
	var ce *provider.ConstraintError
	if !errors.As(err, &ce) || ce.Attribute != "cpus" || ce.Nearest != int64(cpus) || !strings.Contains(err.Error(), "your vagrant host") {
		t.Errorf("cpus = %d on a host of %d: %v (%+v), want refused with nearest %d", cpus+1, cpus, err, ce, cpus)
	}
	err = check("alice", map[string]any{"memory": float64(1 << 20)})
	if !errors.As(err, &ce) || ce.Attribute != "memory" || ce.Nearest == nil || ce.Nearest.(int64) >= 1<<20 {
		t.Errorf("memory = 1 TiB: %v (%+v), want refused with the host's memory as nearest", err, ce)
	}
	if err := check("alice", map[string]any{"memory": float64(32)}); !errors.As(err, &ce) || ce.Nearest != int64(64) {
		t.Errorf("memory = 32: %v, want refused with nearest 64", err)
	}
	if err := check("alice", map[string]any{"cpus": float64(cpus), "memory": float64(256)}); err != nil {
		t.Errorf("cpus = %d, memory = 256: %v", cpus, err)
	}
	if err := check("bob", map[string]any{"cpus": float64(cpus + 1)}); err != nil {
		t.Errorf("bob (no host) cpus = %d: %v, want the provider's limits only", cpus+1, err)
	}
	if err := check("bob", map[string]any{"cpus": float64(1000)}); !errors.As(err, &ce) || ce.Nearest != int64(256) {
		t.Errorf("bob cpus = 1000: %v, want refused with nearest 256", err)
	}
}
