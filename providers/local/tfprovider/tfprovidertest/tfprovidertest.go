// Package tfprovidertest gives tests the kloudlocal Terraform provider built from this tree in a
// private provider mirror, and a private machine network, so they never touch a running demo.
// Start with Terraform and NewHost; call Cleanup from TestMain after m.Run.
package tfprovidertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/internal/tfmachinetest"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider"
)

var mirror = &tfmachinetest.Mirror{Name: tfprovider.Name, Version: tfprovider.Version, Cmd: "./cmd/terraform-provider-kloudlocal"}

// Terraform returns the terraform binary (tfruntest.Setup's) and a CLI config file whose only
// provider source is a temporary filesystem mirror holding kloudlocal, built from this tree once
// per test process (tfmachinetest.Mirror).
func Terraform(t testing.TB) (terraformPath, cliConfig string) {
	t.Helper()
	return mirror.Terraform(t)
}

// Cleanup removes the temporary mirror; call it from TestMain after m.Run.
func Cleanup() { mirror.Cleanup() }

// Host is a private place for machines: a fresh state dir, a unique bridge and a free
// 10.200.N.0/24, plus the base image.
type Host struct {
	StateDir  string
	Bridge    string
	Subnet    netip.Prefix
	BaseImage string
	// Manager works on the same machines (for checks from the test).
	Manager *sandbox.Manager
}

var base struct {
	once sync.Once
	path string
	err  error
}

// NewHost gates the test on root and what machines need, and returns a Host whose machines,
// leftovers and bridge are removed when the test ends, also when it failed.
func NewHost(t *testing.T) *Host {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "ip")
	testutil.RequireBinary(t, "nsenter")
	if err := sandbox.Available(); err != nil {
		testutil.Unavailable(t, "%s", err)
	}
	base.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		base.path, base.err = sandbox.EnsureBaseImage(ctx, "", testutil.Logger(t))
	})
	if base.err != nil {
		if _, err := exec.LookPath("mmdebstrap"); err != nil {
			testutil.Unavailable(t, "base image not cached and mmdebstrap missing: %s", base.err)
		}
		t.Fatalf("base image: %s", base.err)
	}
	b := make([]byte, 3)
	rand.Read(b)
	h := &Host{StateDir: t.TempDir(), Bridge: "kdl" + hex.EncodeToString(b), Subnet: freeSubnet(t), BaseImage: base.path}
	m, err := sandbox.New(sandbox.Options{StateDir: h.StateDir, BaseImage: h.BaseImage, Bridge: h.Bridge, Subnet: h.Subnet, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	h.Manager = m
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := m.GC(ctx, func(sandbox.Info) bool { return false }); err != nil {
			t.Errorf("cleanup: gc: %s", err)
		}
		if err := m.TeardownNetwork(ctx); err != nil {
			t.Errorf("cleanup: %s", err)
		}
	})
	return h
}

// HostAddr is the bridge address.
func (h *Host) HostAddr() netip.Addr { return h.Subnet.Addr().Next() }

// AssertGone fails the test if anything of the machine is left on the host: its directory,
// network namespace, host veth, or a running PID 1.
func (h *Host) AssertGone(t *testing.T, in sandbox.Info) {
	t.Helper()
	if got, err := h.Manager.Info(t.Context(), in.ID); err != nil || got.State != sandbox.StateAbsent {
		t.Errorf("machine %s after destroy: %+v %v", in.ID, got, err)
	}
	for _, p := range []string{in.Dir, "/run/netns/" + in.Netns, "/sys/class/net/" + in.HostVeth} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("machine %s: %s is left", in.ID, p)
		}
	}
	if in.PID > 0 {
		// A reused PID is possible; the machine's PID 1 is recognised by its environment.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", in.PID)); err == nil && strings.Contains(string(b), "KLOUD_SANDBOX_STAGE=") {
			t.Errorf("machine %s: PID 1 %d still runs", in.ID, in.PID)
		}
	}
}

func freeSubnet(t *testing.T) netip.Prefix {
	t.Helper()
	p, release, err := sandbox.FreeSubnet(100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return p
}
