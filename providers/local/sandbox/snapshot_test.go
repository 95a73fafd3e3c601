package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
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

// Snapshots of machines with a disk quota (disk_mb): saved and restored through the disk image,
// mounted in a private mount namespace (the host's mount table never shows it, no loop device is
// left); the quota holds after a restore; a snapshot bigger than the disk fails cleanly, the
// disk as it was; a quota machine's snapshot restores into a machine without one.
func TestSnapshotDiskQuota(t *testing.T) {
	e := newEnv(t)
	testutil.RequireBinary(t, "mkfs.ext4")
	testutil.RequireBinary(t, "losetup")
	ctx := t.Context()
	ud := []byte("#cloud-config\n{}\n")
	e.create(t, sandbox.Spec{ID: "dq-a", UserData: ud, DiskMB: 64})
	e.create(t, sandbox.Spec{ID: "dq-b", UserData: ud})
	stop := func(id string) {
		t.Helper()
		if _, err := e.m.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	start := func(id string) {
		t.Helper()
		if _, err := e.m.Start(ctx, id); err != nil {
			t.Fatalf("start %s: %v\n%s", id, err, e.console(id))
		}
	}
	noMount := func(when string) { t.Helper(); e.noDiskMount(t, "dq-a", when) }
	used := func(id string) int {
		t.Helper()
		f := strings.Fields(strings.Split(e.exec(t, id, "df", "-m", "--output=size,used", "/"), "\n")[1])
		size, _ := strconv.Atoi(f[0])
		u, _ := strconv.Atoi(f[1])
		if size < 40 || size > 64 {
			t.Errorf("df in %s: %s MB, want the 64 MB quota", id, f[0])
		}
		return u
	}

	e.exec(t, "dq-a", "sh", "-c", "echo v1 > /root/keep.txt && sync")
	stop("dq-a")
	snap, err := e.m.SaveDisk(ctx, "dq-a", "q1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot of a 64 MB disk: %+v", snap)
	noMount("after SaveDisk")
	start("dq-a")
	e.exec(t, "dq-a", "sh", "-c", "echo v2 > /root/keep.txt && touch /root/later && sync")
	stop("dq-a")
	if err := e.m.RestoreDisk(ctx, "dq-a", "q1"); err != nil {
		t.Fatal(err)
	}
	noMount("after RestoreDisk")
	start("dq-a")
	if got := e.exec(t, "dq-a", "sh", "-c", "cat /root/keep.txt; test -e /root/later && echo LATER; true"); got != "v1" {
		t.Errorf("after restore: %q, want v1", got)
	}
	before := used("dq-a")
	out, err := e.m.Exec(ctx, "dq-a", "dd", "if=/dev/zero", "of=/root/big", "bs=1M", "count=100")
	if err == nil || !strings.Contains(string(out)+err.Error(), "No space left on device") {
		t.Errorf("writing 100 MB on the restored 64 MB disk: %v: %s", err, out)
	}
	e.exec(t, "dq-a", "rm", "-f", "/root/big")

	// 80 MB that do not compress, from the machine without a quota: too big for dq-a.
	e.exec(t, "dq-b", "sh", "-c", "head -c 80M /dev/urandom > /root/big && sync")
	stop("dq-b")
	if _, err := e.m.SaveDisk(ctx, "dq-b", "big"); err != nil {
		t.Fatal(err)
	}
	stop("dq-a")
	err = e.m.RestoreDisk(ctx, "dq-a", "big")
	if err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("restore of an 80 MB snapshot into a 64 MB disk: %v", err)
	}
	t.Logf("too big: %v", err)
	noMount("after the failed RestoreDisk")
	start("dq-a")
	if got := e.exec(t, "dq-a", "sh", "-c", "cat /root/keep.txt; test -e /root/big && echo BIG; true"); got != "v1" {
		t.Errorf("after the failed restore: %q, want v1", got)
	}
	if after := used("dq-a"); after > before+2 {
		t.Errorf("the failed restore left %d MB on the disk (%d MB used before, %d after)", after-before, before, after)
	}

	// The quota machine's snapshot into the machine without one.
	if err := e.m.RestoreDisk(ctx, "dq-b", "q1"); err != nil {
		t.Fatal(err)
	}
	start("dq-b")
	if got := e.exec(t, "dq-b", "sh", "-c", "cat /root/keep.txt; test -e /root/big && echo BIG; grep -q dq-b /var/lib/cloud/seed/nocloud/meta-data && echo OWN"); got != "v1\nOWN" {
		t.Errorf("dq-b after restoring dq-a's snapshot: %q", got)
	}
}

// envDiskJob makes the test binary a process that saves or restores one machine's disk (a JSON
// diskJob), for TestSnapshotDiskKilled to kill.
const envDiskJob = "KLOUD_SANDBOX_TEST_DISKJOB"

type diskJob struct {
	StateDir, BaseImage, Bridge string
	Subnet                      netip.Prefix
	Op, Machine, Snapshot       string
}

func runDiskJob(job string) int {
	var j diskJob
	if err := json.Unmarshal([]byte(job), &j); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	m, err := sandbox.New(sandbox.Options{StateDir: j.StateDir, BaseImage: j.BaseImage, Bridge: j.Bridge, Subnet: j.Subnet})
	if err == nil {
		if j.Op == "save" {
			_, err = m.SaveDisk(context.Background(), j.Machine, j.Snapshot)
		} else {
			err = m.RestoreDisk(context.Background(), j.Machine, j.Snapshot)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// A kloud killed (SIGKILL) while it saves or restores the disk of a machine with a disk quota
// leaves no mount and no loop device (the mount lived in a namespace of the killed process), the
// disk intact, and the next operations clean up after it. (That a killed restore leaves the old
// layer or the new one, never a mix, is internal/layersnap's TestRestoreKilled.)
func TestSnapshotDiskKilled(t *testing.T) {
	e := newEnv(t)
	testutil.RequireBinary(t, "mkfs.ext4")
	testutil.RequireBinary(t, "losetup")
	ctx := t.Context()
	e.create(t, sandbox.Spec{ID: "dk", UserData: []byte("#cloud-config\n{}\n"), DiskMB: 128})
	e.exec(t, "dk", "sh", "-c", "head -c 40M /dev/urandom > /root/r && echo A > /root/marker && sync")
	sum := e.exec(t, "dk", "sha256sum", "/root/r")
	if _, err := e.m.Stop(ctx, "dk"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.SaveDisk(ctx, "dk", "k1"); err != nil { // marker A
		t.Fatal(err)
	}
	if _, err := e.m.Start(ctx, "dk"); err != nil {
		t.Fatal(err)
	}
	e.exec(t, "dk", "sh", "-c", "echo B > /root/marker && sync")
	if _, err := e.m.Stop(ctx, "dk"); err != nil {
		t.Fatal(err)
	}
	run := func(op string, killAfter time.Duration) (time.Duration, error) {
		t.Helper()
		job, _ := json.Marshal(diskJob{StateDir: e.stateDir, BaseImage: e.base, Bridge: e.bridge, Subnet: e.subnet, Op: op, Machine: "dk", Snapshot: "k2"})
		if op == "restore" {
			job, _ = json.Marshal(diskJob{StateDir: e.stateDir, BaseImage: e.base, Bridge: e.bridge, Subnet: e.subnet, Op: op, Machine: "dk", Snapshot: "k1"})
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envDiskJob+"="+string(job))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if killAfter > 0 {
			time.Sleep(killAfter)
			cmd.Process.Kill()
		}
		err := cmd.Wait()
		if err != nil && killAfter == 0 {
			t.Fatalf("%s in a child: %v: %s", op, err, stderr.String())
		}
		return time.Since(t0), err
	}
	clean := func(when string) { t.Helper(); e.noDiskMount(t, "dk", when) }
	full := map[string]time.Duration{}
	for _, op := range []string{"save", "restore"} {
		full[op], _ = run(op, 0)
		t.Logf("a whole %s in a child: %s", op, full[op])
		clean("after a whole " + op)
	}
	// The disk is k1's now (marker A). Kill each operation at 10-90% of its time.
	for i, frac := range []int{10, 50, 90} {
		for _, op := range []string{"save", "restore"} {
			_, err := run(op, full[op]*time.Duration(frac)/100)
			t.Logf("round %d, %s killed at %d%%: %v", i, op, frac, err)
			clean(fmt.Sprintf("round %d, %s killed at %d%%", i, op, frac))
		}
	}
	if _, err := e.m.Start(ctx, "dk"); err != nil {
		t.Fatalf("start after the kills: %v\n%s", err, e.console("dk"))
	}
	if got := e.exec(t, "dk", "sha256sum", "/root/r"); got != sum {
		t.Errorf("/root/r after the kills: %s, want %s", got, sum)
	}
	if got := e.exec(t, "dk", "cat", "/root/marker"); got != "A" {
		t.Errorf("marker after the kills: %q, want A (k1's)", got)
	}
	if _, err := e.m.Stop(ctx, "dk"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.RestoreDisk(ctx, "dk", "k1"); err != nil { // also removes a killed restore's leftovers
		t.Fatalf("restore after the kills: %v", err)
	}
	for _, s := range []string{"k1", "k2"} {
		if err := e.m.DeleteSnapshot(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.stateDir, ".snapshots")); len(ents) != 0 {
		t.Errorf("left in the snapshot dir: %v", ents)
	}
	clean("at the end")
}

// noDiskMount fails the test if the host's mount table shows machine id's disk or a loop device
// of its image is left (it goes away with its last mount, so this waits a little).
func (e *env) noDiskMount(t *testing.T, id, when string) {
	t.Helper()
	dir := filepath.Join(e.stateDir, id)
	if m := hostMountinfoMentions(t, dir); len(m) != 0 {
		t.Fatalf("%s: the host's mount table shows the machine's disk: %v", when, m)
	}
	var loops []byte
	testutil.Eventually(t, 30*time.Second, func() bool {
		var err error
		loops, err = exec.Command("losetup", "-a").CombinedOutput()
		return err == nil && !strings.Contains(string(loops), dir)
	}, "%s: a loop device of the machine's disk is left: %s", when, &loops)
}
