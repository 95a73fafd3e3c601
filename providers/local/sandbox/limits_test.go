package sandbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// Inside a machine with limits, free shows its memory limit as the total and nproc its CPUs
// (ceil of the quota), and the files that say so are read-only; a machine without limits shows
// the host's.
func TestLimitsShownInside(t *testing.T) {
	e := newEnv(t)
	if err := e.m.SetupNetwork(t.Context()); err != nil {
		t.Fatal(err)
	}
	// What the machine's own processes (descendants of its init, as klient and its terminals
	// are) see; Exec enters from the host and keeps the host's CPU affinity.
	ud := []byte("#cloud-config\nruncmd:\n  - nproc > /var/tmp/nproc\n  - getconf _NPROCESSORS_ONLN > /var/tmp/online\n")
	e.create(t, sandbox.Spec{ID: "lim-1", Hostname: "lim-1", UserData: ud, MemoryMB: 300, CPUs: 0.5})
	e.create(t, sandbox.Spec{ID: "lim-2", Hostname: "lim-2", UserData: ud})
	e.waitCloudInit(t, "lim-1")
	e.waitCloudInit(t, "lim-2")

	free := e.exec(t, "lim-1", "free", "-m")
	t.Logf("free -m in a machine of 300 MB:\n%s", free)
	fields := strings.Fields(strings.Split(free, "\n")[1]) // Mem: total used free ...
	if fields[0] != "Mem:" || fields[1] != "300" {
		t.Errorf("free -m: total %v, want 300", fields)
	}
	if used, err := strconv.Atoi(fields[2]); err != nil || used < 0 || used > 300 {
		t.Errorf("free -m: used %q: want 0-300", fields[2])
	}
	if got := e.exec(t, "lim-1", "cat", "/var/tmp/nproc"); got != "1" {
		t.Errorf("nproc in a machine of 0.5 CPUs: %s, want 1", got)
	}
	if got := e.exec(t, "lim-1", "cat", "/var/tmp/online"); got != "1" {
		t.Errorf("getconf _NPROCESSORS_ONLN in a machine of 0.5 CPUs: %s, want 1", got)
	}
	if out, err := e.m.Exec(t.Context(), "lim-1", "sh", "-c", "echo 'MemTotal: 1 kB' > /proc/meminfo"); err == nil {
		t.Errorf("root in the machine could write its /proc/meminfo: %s", out)
	}
	host := strconv.Itoa(runtime.NumCPU())
	if got := e.exec(t, "lim-2", "cat", "/var/tmp/nproc"); got != host {
		t.Errorf("nproc in a machine without limits: %s, want the host's %s", got, host)
	}
	if got := e.exec(t, "lim-2", "free", "-m"); strings.Fields(strings.Split(got, "\n")[1])[1] == "300" {
		t.Errorf("free in a machine without limits:\n%s", got)
	}
}

// A machine with a disk quota: df inside shows it, writing past it fails with ENOSPC, what it
// wrote survives stop and start, and the host's state dir holds it in the sparse image only.
func TestDiskQuota(t *testing.T) {
	e := newEnv(t)
	testutil.RequireBinary(t, "mkfs.ext4")
	if err := e.m.SetupNetwork(t.Context()); err != nil {
		t.Fatal(err)
	}
	ud := []byte("#cloud-config\n{}\n")
	if _, err := e.m.Create(t.Context(), sandbox.Spec{ID: "disk-0", UserData: ud, DiskMB: 10}); err == nil || !strings.Contains(err.Error(), "at least 64") {
		t.Fatalf("create with a 10 MB disk: %v", err)
	}
	info := e.create(t, sandbox.Spec{ID: "disk-1", Hostname: "disk-1", UserData: ud, DiskMB: 128})
	if info.DiskMB != 128 || info.Disk != filepath.Join(info.Dir, "disk.img") {
		t.Errorf("info: disk %d MB at %s, want 128 in disk.img", info.DiskMB, info.Disk)
	}
	df := e.exec(t, "disk-1", "df", "-m", "--output=size,avail", "/")
	t.Logf("df -m / in a machine with a 128 MB disk:\n%s", df)
	f := strings.Fields(strings.Split(df, "\n")[1])
	if size, err := strconv.Atoi(f[0]); err != nil || size < 100 || size > 128 {
		t.Errorf("df: size %q MB, want 100-128", f[0])
	}
	e.exec(t, "disk-1", "sh", "-c", "echo kept > /root/kept && sync")
	out, err := e.m.Exec(t.Context(), "disk-1", "dd", "if=/dev/zero", "of=/root/big", "bs=1M", "count=200")
	if err == nil || !strings.Contains(string(out)+err.Error(), "No space left on device") {
		t.Errorf("writing 200 MB on a 128 MB disk: %v: %s", err, out)
	}
	e.exec(t, "disk-1", "rm", "-f", "/root/big")
	if _, err := e.m.Stop(t.Context(), "disk-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Start(t.Context(), "disk-1"); err != nil {
		t.Fatalf("start again: %v\n%s", err, e.console("disk-1"))
	}
	if got := e.exec(t, "disk-1", "cat", "/root/kept"); got != "kept" {
		t.Errorf("after stop and start, /root/kept: %q", got)
	}
	// Nothing of the machine's disk is in the state dir's own filesystem but the image, and
	// nothing is mounted in the host's namespace.
	if entries, _ := os.ReadDir(filepath.Join(e.stateDir, "disk-1", "disk")); len(entries) != 0 {
		t.Errorf("the mount point of the disk has %d entries on the host", len(entries))
	}
	if m := hostMountinfoMentions(t, filepath.Join(e.stateDir, "disk-1")); len(m) != 0 {
		t.Errorf("the host's mount table shows the machine's disk: %v", m)
	}
	// Snapshots of its disk: TestSnapshotDiskQuota (snapshot_test.go).
	// Destroyed, it leaves no loop device behind.
	if err := e.m.Destroy(t.Context(), "disk-1"); err != nil {
		t.Fatal(err)
	}
	var loops []byte
	testutil.Eventually(t, 30*time.Second, func() bool {
		var err error
		loops, err = exec.Command("losetup", "-a").CombinedOutput()
		return err == nil && !strings.Contains(string(loops), e.stateDir)
	}, "a loop device of the destroyed machine's disk is left: %s", &loops)
}
