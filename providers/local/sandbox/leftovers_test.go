package sandbox_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// TestLeftovers: a running machine whose directory (and so machine.json) vanished — what a
// destroy that failed half-way, or a crash inside its directory's removal, leaves — is listed
// by Leftovers with its namespace, veth, cgroup and, from the ledger, the machine it was (id,
// instance, the tags SetTags set last); a machine with a record is not, and RemoveLeftover refuses it, refuses names
// that are not this manager's, and ids that are not ids. RemoveLeftover of the leftover kills
// its processes and removes every part and the ledger entry; the other machine runs on
// untouched; a second removal is no error. A directory without machine.json and a host mount in
// it are listed and removed too. Destroy leaves no ledger entry.
func TestLeftovers(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	tags := map[string]string{"kloud_stack": "s1", "kloud_machine": "m1"}
	keep := e.create(t, sandbox.Spec{ID: "lo-keep", Instance: "inst-a", Tags: tags})
	lost := e.create(t, sandbox.Spec{ID: "lo-lost", Hostname: "lost", Instance: "inst-a", Tags: map[string]string{"kloud_stack": "s1", "kloud_machine": "m2"}})
	if los, err := e.m.Leftovers(ctx); err != nil || len(los) != 0 {
		t.Fatalf("leftovers of healthy machines: %+v %v", los, err)
	}
	// The ledger follows the tags: the leftover is known by the tags set last.
	if _, err := e.m.SetTags(ctx, "lo-lost", map[string]string{"kloud_stack": "s1", "kloud_machine": "m2-tagged"}); err != nil {
		t.Fatal(err)
	}
	cg := sandbox.CgroupOf(e.m, "lo-lost")
	if err := os.RemoveAll(lost.Dir); err != nil {
		t.Fatal(err)
	}

	los, err := e.m.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(los) != 1 {
		t.Fatalf("leftovers: %+v, want lo-lost's", los)
	}
	lo := los[0]
	if lo.ID != "lo-lost" || lo.Hostname != "lost" || lo.Instance != "inst-a" || lo.Tags["kloud_machine"] != "m2-tagged" || lo.CreatedAt.IsZero() ||
		lo.Netns != lost.Netns || lo.HostVeth != lost.HostVeth || lo.Cgroup != cg || !lo.Ledger {
		t.Fatalf("leftover: %+v (machine was %+v)", lo, lost)
	}
	for _, want := range []string{"netns " + lost.Netns, "veth " + lost.HostVeth, "cgroup " + cg} {
		if !strings.Contains(lo.Parts(), want) {
			t.Errorf("Parts() = %q, lacks %q", lo.Parts(), want)
		}
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(lost.PID))); err != nil {
		t.Fatalf("the lost machine's PID 1 should still run (a leftover with processes): %v", err)
	}

	// Hostile or stale removals are refused and change nothing.
	for _, bad := range []sandbox.Leftover{
		{ID: "lo-keep"},                 // has a record
		{ID: "../lo-keep"},              // not an id
		{Netns: "kd-000000-0000000000"}, // not this manager's
		{Cgroup: "../../system.slice"},  // not a machine cgroup
		{HostVeth: "eth0"},              // not a machine veth
	} {
		if err := e.m.RemoveLeftover(ctx, bad); err == nil {
			t.Errorf("RemoveLeftover(%+v) succeeded", bad)
		}
	}
	if in, _ := e.m.Info(ctx, "lo-keep"); in.State != sandbox.StateRunning || in.PID != keep.PID {
		t.Fatalf("lo-keep after refused removals: %+v", in)
	}

	// The crash also left the directory itself, without machine.json, with a host mount in it
	// (RemoveAll must never descend into one).
	mnt := filepath.Join(lost.Dir, "rootfs")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mnt, "kept-by-the-mount"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if los, err = e.m.Leftovers(ctx); err != nil || len(los) != 1 || los[0].Dir != lost.Dir || len(los[0].Mounts) != 1 || los[0].Mounts[0] != mnt {
		t.Fatalf("leftovers with the directory and its mount: %+v %v", los, err)
	}
	lo = los[0]
	if err := e.m.RemoveLeftover(ctx, lo); err != nil {
		t.Fatal(err)
	}
	if ms := hostMountinfoMentions(t, lost.Dir); len(ms) > 0 {
		t.Errorf("mounts left under the lost machine's directory: %q", ms)
	}
	e.assertGone(t, lost, filepath.Join("/sys/fs/cgroup/pids", cg))
	if los, err := e.m.Leftovers(ctx); err != nil || len(los) != 0 {
		t.Errorf("leftovers after removal: %+v %v", los, err)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, ".ledger", "lo-lost.json")); !os.IsNotExist(err) {
		t.Errorf("ledger entry after removal: %v", err)
	}
	if err := e.m.RemoveLeftover(ctx, lo); err != nil {
		t.Errorf("second removal: %v", err)
	}
	if in, _ := e.m.Info(ctx, "lo-keep"); in.State != sandbox.StateRunning || in.PID != keep.PID {
		t.Fatalf("lo-keep after the leftover's removal: %+v", in)
	}
	if err := e.m.Destroy(ctx, "lo-keep"); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.stateDir, ".ledger")); len(ents) != 0 {
		t.Errorf("ledger after destroy: %v", ents)
	}
}
