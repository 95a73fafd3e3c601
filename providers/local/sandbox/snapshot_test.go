package sandbox_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// A snapshot of a stopped machine's disk restores it exactly as it was (contents, hard and
// symbolic links, setuid bits, the overlay's whiteouts and opaque directories), into the same
// machine and into another one, which keeps its own identity (machine-id, seed) and finishes
// cloud-init as itself. A symlink on the machine's disk never makes the restore touch the host.
func TestSnapshotRestore(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	ud := []byte("#cloud-config\nruncmd:\n  - echo ran > /var/tmp/ran\n")
	e.create(t, sandbox.Spec{ID: "snap-a", UserData: ud, MemoryMB: 256})
	e.create(t, sandbox.Spec{ID: "snap-b", UserData: ud, MemoryMB: 256})
	e.waitCloudInit(t, "snap-a")
	e.waitCloudInit(t, "snap-b")

	e.exec(t, "snap-a", "sh", "-ec", `
echo v1 > /root/keep.txt
ln -s keep.txt /root/link
ln /root/keep.txt /root/hard
cp /bin/true /root/suid && chmod 4755 /root/suid
rm /etc/issue
rm -rf /usr/share/doc/bash && mkdir /usr/share/doc/bash && echo mine > /usr/share/doc/bash/only
sync`)
	machineIDA := e.exec(t, "snap-a", "cat", "/etc/machine-id")
	if _, err := e.m.SaveDisk(ctx, "snap-a", "s1"); !errors.Is(err, sandbox.ErrRunning) {
		t.Fatalf("SaveDisk of a running machine: %v, want ErrRunning", err)
	}
	stop := func(id string) {
		t.Helper()
		if _, err := e.m.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	start := func(id string) {
		t.Helper()
		if _, err := e.m.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	stop("snap-a")
	snap, err := e.m.SaveDisk(ctx, "snap-a", "s1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %d bytes for %d bytes in %d files", snap.Size, snap.DiskSize, snap.Files)
	if st, err := os.Stat(e.m.SnapshotPath("s1")); err != nil || st.Size() != snap.Size || snap.Files < 10 {
		t.Fatalf("snapshot file: %v %v, info %+v", st, err, snap)
	}

	start("snap-a")
	e.exec(t, "snap-a", "sh", "-ec", "echo v2 > /root/keep.txt; touch /root/later; echo back > /etc/issue; sync")
	if err := e.m.RestoreDisk(ctx, "snap-a", "s1"); !errors.Is(err, sandbox.ErrRunning) {
		t.Fatalf("RestoreDisk of a running machine: %v, want ErrRunning", err)
	}
	stop("snap-a")
	if err := e.m.RestoreDisk(ctx, "snap-a", "s1"); err != nil {
		t.Fatal(err)
	}
	start("snap-a")
	check := func(id string) {
		t.Helper()
		got := e.exec(t, id, "sh", "-c", `cat /root/keep.txt; readlink /root/link; stat -c %h /root/hard; stat -c %a /root/suid
test -e /root/later && echo LATER; test -e /etc/issue && echo ISSUE; ls /usr/share/doc/bash`)
		want := "v1\nkeep.txt\n2\n4755\nonly"
		if got != want {
			t.Errorf("machine %s after restore:\n%s\nwant\n%s", id, got, want)
		}
	}
	check("snap-a")
	if got := e.exec(t, "snap-a", "cat", "/etc/machine-id"); got != machineIDA {
		t.Errorf("machine-id after restore: %s, want %s", got, machineIDA)
	}

	// Into another machine, whose /etc/kloud its root made a symlink to a host directory.
	host := t.TempDir()
	sentinel := filepath.Join(host, "kite.key")
	if err := os.WriteFile(sentinel, []byte("host's"), 0o600); err != nil {
		t.Fatal(err)
	}
	machineIDB := e.exec(t, "snap-b", "cat", "/etc/machine-id")
	e.exec(t, "snap-b", "sh", "-ec", "rm -rf /etc/kloud && ln -s "+host+" /etc/kloud && sync")
	seedB := filepath.Join(e.stateDir, "snap-b", "upper", "var/lib/cloud/seed/nocloud/meta-data")
	metaB, err := os.ReadFile(seedB)
	if err != nil || !strings.Contains(string(metaB), "snap-b") {
		t.Fatalf("machine b's seed: %q %v", metaB, err)
	}
	stop("snap-b")
	if err := e.m.RestoreDisk(ctx, "snap-b", "s1"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(sentinel); err != nil || string(b) != "host's" {
		t.Fatalf("the host file behind the machine's symlink: %q %v", b, err)
	}
	if ents, _ := os.ReadDir(host); len(ents) != 1 {
		t.Fatalf("the host dir behind the machine's symlink holds %d entries", len(ents))
	}
	if got, _ := os.ReadFile(seedB); string(got) != string(metaB) {
		t.Errorf("machine b's seed after restore: %q, want its own %q", got, metaB)
	}
	start("snap-b")
	check("snap-b")
	if got := e.exec(t, "snap-b", "cat", "/etc/machine-id"); got != machineIDB {
		t.Errorf("machine b's machine-id after restore: %s, want its own %s", got, machineIDB)
	}
	e.waitCloudInit(t, "snap-b")

	ids, err := e.m.Snapshots()
	if err != nil || len(ids) != 1 || ids[0] != "s1" {
		t.Fatalf("Snapshots: %v %v", ids, err)
	}
	if err := e.m.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatalf("delete again: %v", err)
	}
	if ids, _ := e.m.Snapshots(); len(ids) != 0 {
		t.Fatalf("after delete: %v", ids)
	}
	stop("snap-a")
	if err := e.m.RestoreDisk(ctx, "snap-a", "s1"); !errors.Is(err, sandbox.ErrSnapshotNotFound) {
		t.Fatalf("restore of a deleted snapshot: %v", err)
	}
}
