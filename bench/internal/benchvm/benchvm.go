// Package benchvm boots the real local machine a benchmark measures against (providers/local's
// sandbox library: its own namespaces, veth and a bridge of the benchmark's own, booted from the
// base image), with the benchmark's kloud (bench/internal/kloudchild) on the bridge's host
// address and the benchmark's binaries and the agent's kite key in the machine's /opt/bench.
// Start with Boot; bench/ports and bench/ssh use it.
package benchvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/kloud-dev/kloud/bench/internal/kloudchild"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// Options say which machine to boot.
type Options struct {
	ID     string            // the machine's id (required)
	Work   string            // a directory of the benchmark (removed by it): the machines' state, kloud's data
	Bridge string            // the bridge name's prefix (4 characters; a random suffix is added)
	Subnet int               // the lowest 10.200.N.0/24 to try
	Files  map[string]string // files to put in /opt/bench: a path on this host → its name there
}

// SkipError says the host lacks what a local machine needs (root, the base image, the
// sandbox's tools): the benchmark says so and skips.
type SkipError struct{ Err error }

func (e *SkipError) Error() string { return e.Err.Error() }
func (e *SkipError) Unwrap() error { return e.Err }

// Machine is a booted machine and the benchmark's kloud.
type Machine struct {
	Kloud  *kloudchild.Kloud
	Info   sandbox.Info // IP: its address on the bridge
	Subnet netip.Prefix
	m      *sandbox.Manager
	id     string
	undo   []func()
}

// Boot creates the machine, starts kloud on the bridge's host address, puts o.Files and the
// agent's kite key (kite.key) into /opt/bench, boots it and waits for cloud-init. Close removes
// everything, also after an error (Boot cleans up itself then).
func Boot(ctx context.Context, o Options) (_ *Machine, err error) {
	if os.Geteuid() != 0 {
		return nil, &SkipError{errors.New("local machines need root")}
	}
	if err := sandbox.Available(); err != nil {
		return nil, &SkipError{err}
	}
	log := slog.New(slog.DiscardHandler)
	base, err := sandbox.EnsureBaseImage(ctx, "", log)
	if err != nil {
		return nil, &SkipError{err}
	}
	vm := &Machine{id: o.ID}
	defer func() {
		if err != nil {
			vm.Close()
		}
	}()
	if vm.Subnet, _, err = sandbox.FreeSubnet(o.Subnet); err != nil { // held until the bench ends
		return nil, err
	}
	suffix := make([]byte, 2)
	rand.Read(suffix)
	if vm.m, err = sandbox.New(sandbox.Options{StateDir: filepath.Join(o.Work, "machines"), BaseImage: base,
		Bridge: o.Bridge + hex.EncodeToString(suffix), Subnet: vm.Subnet, Logger: log}); err != nil {
		return nil, err
	}
	vm.undo = append(vm.undo, func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		vm.m.GC(cctx, func(sandbox.Info) bool { return false })
		vm.m.TeardownNetwork(cctx)
	})
	in, err := vm.m.Create(ctx, sandbox.Spec{ID: o.ID})
	if err != nil {
		return nil, fmt.Errorf("create machine: %w", err)
	}
	// kloud on the bridge's host address, where the machine's klient reaches it.
	if vm.Kloud, err = kloudchild.Start(ctx, filepath.Join(o.Work, "kloud"), net.JoinHostPort(vm.m.HostAddr().String(), "0")); err != nil {
		return nil, err
	}
	vm.undo = append(vm.undo, vm.Kloud.Stop)
	// The binaries and the agent's key go onto the machine's disk while it is stopped.
	if _, err := vm.m.Stop(ctx, o.ID); err != nil {
		return nil, err
	}
	dst := filepath.Join(in.Dir, "upper", "opt", "bench")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, err
	}
	files := map[string]string{vm.Kloud.KiteKey: "kite.key"}
	for src, name := range o.Files {
		files[src] = name
	}
	for src, name := range files {
		if err := copyFile(src, filepath.Join(dst, name)); err != nil {
			return nil, err
		}
	}
	if in, err = vm.m.Start(ctx, o.ID); err != nil {
		return nil, err
	}
	// cloud-init first (it would compete for the CPUs), then what the benchmark starts.
	deadline := time.Now().Add(3 * time.Minute)
	for in.CloudInit != sandbox.CloudInitDone && in.CloudInit != sandbox.CloudInitError {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("cloud-init of the machine did not finish (%s); see %s/console.log", in.CloudInit, in.Dir)
		}
		time.Sleep(500 * time.Millisecond)
		if in, err = vm.m.Info(ctx, o.ID); err != nil {
			return nil, err
		}
	}
	vm.Info = in
	return vm, nil
}

// Exec runs argv in the machine and returns its output.
func (vm *Machine) Exec(ctx context.Context, argv ...string) ([]byte, error) {
	return vm.m.Exec(ctx, vm.id, argv...)
}

// Background starts cmd (a shell command line) in the machine in its own session, its output
// appended to log there.
func (vm *Machine) Background(ctx context.Context, cmd, log string) error {
	_, err := vm.m.Exec(ctx, vm.id, "/bin/sh", "-c", "setsid "+cmd+" </dev/null >>"+log+" 2>&1 &")
	return err
}

// Close stops kloud and removes the machine, its bridge and its state.
func (vm *Machine) Close() {
	for i := len(vm.undo) - 1; i >= 0; i-- {
		vm.undo[i]()
	}
	vm.undo = nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, fi.Mode().Perm())
}
