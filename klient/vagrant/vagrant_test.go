package vagrant_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/vagrant"
)

// A long vagrant command ends with its caller's context: its whole process group is killed at
// once. A script that takes a minute stands in for a slow `vagrant up` (klient's tests run the
// real one); what is tested is the process handling.
func TestCommandEndsWithContext(t *testing.T) {
	testutil.RequireBinary(t, "sh")
	dir := t.TempDir()
	bin, pidFile := filepath.Join(dir, "vagrant"), filepath.Join(dir, "pid")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nsleep 60 &\necho $! > "+pidFile+"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := vagrant.New(vagrant.Options{Home: filepath.Join(dir, "home"), Vagrant: bin, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(t.Context(), klientapi.VagrantCreateParams{Name: "m1", Image: "debian:12"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := m.Up(ctx, "m1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("up: %v, want the deadline", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("up returned after %s", d)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH },
		"the vagrant command's child %d still runs", pid)
}

// Create writes the machine's directory from validated values only: the Vagrantfile is the same
// for every machine, the parameters are JSON, the user data is the seed (0600).
func TestCreateWritesDataNotRuby(t *testing.T) {
	testutil.RequireBinary(t, "sh")
	dir := t.TempDir()
	m, err := vagrant.New(vagrant.Options{Home: dir, Vagrant: "sh"})
	if err != nil {
		t.Fatal(err)
	}
	p := klientapi.VagrantCreateParams{Name: "a1", Image: "kloud/base:1", Hostname: "h1", MemoryMB: 128, CPUs: 2, UserData: "#cloud-config\n{}\n"}
	vm, err := m.Create(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	q := p
	q.Name, q.Image, q.Hostname = "a2", "other/image:2", "h2"
	vm2, err := m.Create(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	v1, _ := os.ReadFile(filepath.Join(vm.Dir, "Vagrantfile"))
	v2, _ := os.ReadFile(filepath.Join(vm2.Dir, "Vagrantfile"))
	if string(v1) != string(v2) || len(v1) == 0 {
		t.Error("Vagrantfiles differ between machines: a parameter is in the Ruby source")
	}
	st, err := os.Stat(filepath.Join(vm.Dir, "seed", "user-data"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("user-data: %v %v", st, err)
	}
	js, _ := os.ReadFile(filepath.Join(vm.Dir, "kloud.json"))
	if !strings.Contains(string(js), `"image": "kloud/base:1"`) || !strings.Contains(string(js), `"provider": "docker"`) {
		t.Errorf("kloud.json:\n%s", js)
	}
	if _, err := m.Create(t.Context(), klientapi.VagrantCreateParams{Name: "../x", Image: "a"}); err == nil {
		t.Error("a name with a path was accepted")
	}
}

// Info reports this host's CPUs, memory and architecture (what kloud bounds constraints by).
func TestInfo(t *testing.T) {
	m, err := vagrant.New(vagrant.Options{Home: t.TempDir(), Vagrant: "true"})
	if err != nil {
		t.Fatal(err)
	}
	in, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var kb int64
	fmt.Sscanf(strings.SplitN(string(mem), "\n", 2)[0], "MemTotal: %d kB", &kb)
	if in.CPUs != runtime.NumCPU() || in.Arch != runtime.GOARCH || in.MemoryMB != kb>>10 {
		t.Errorf("info %+v, want %d CPUs, %s, %d MiB (MemTotal)", in, runtime.NumCPU(), runtime.GOARCH, kb>>10)
	}
}
