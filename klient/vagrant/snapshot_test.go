package vagrant_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/layersnap"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/vagrant"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
)

// Snapshots of docker machines on a real vagrant host (real vagrant, its docker provider, a
// private dockerd with overlay2): a running machine is refused; a snapshot restored into its own
// machine brings back the saved file; restored into another machine of the same image, the file
// comes and that machine keeps its own identity (kite key); a machine of another image refuses it
// and keeps its disk; bad and unknown ids are refused; delete is idempotent and leaves nothing.
func TestSnapshotDockerMachine(t *testing.T) {
	testutil.RequireBinary(t, "vagrant")
	d := dockertest.New(t)
	const img = "kloud-vagrant-snap:1"
	d.Import(t, img)
	home := t.TempDir()
	m, err := vagrant.New(vagrant.Options{Home: home, Env: []string{d.Env()}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The whole sequence (some 20 vagrant commands, each a Ruby process) took over 10 minutes
	// on a loaded 2-core host running the suite (ci48, ci50: "context deadline exceeded").
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()
	ids := map[string]string{}
	up := func(name string) {
		t.Helper()
		vm, err := m.Up(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = vm.ID
	}
	halt := func(name string) {
		t.Helper()
		if _, err := m.Halt(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	sh := func(name, script string) string {
		t.Helper()
		return strings.TrimSpace(d.Docker(t, "exec", ids[name], "sh", "-c", script))
	}
	create := func(name, image string) {
		t.Helper()
		// A user data that does nothing: what is tested is the disk, not the agent.
		if _, err := m.Create(ctx, klientapi.VagrantCreateParams{Name: name, Image: image, UserData: "#cloud-config\n{}\n"}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Destroy(context.Background(), name); err != nil {
				t.Errorf("destroy %s: %v", name, err)
			}
		})
		up(name)
	}
	create("m1", img)
	create("m2", img)
	sh("m1", "mkdir -p /etc/kloud && echo key-m1 > /etc/kloud/kite.key && echo saved > /root/f && sync")
	sh("m2", "mkdir -p /etc/kloud && echo key-m2 > /etc/kloud/kite.key && echo m2-own > /root/f && sync")

	if _, err := m.SnapshotSave(ctx, "m1", "s1"); !errors.Is(err, vagrant.ErrRunning) {
		t.Fatalf("snapshot of a running machine: %v, want ErrRunning", err)
	}
	halt("m1")
	for _, bad := range []string{"../x", "", ".s", "a/b"} {
		if _, err := m.SnapshotSave(ctx, "m1", bad); err == nil {
			t.Errorf("snapshot id %q accepted", bad)
		}
	}
	sn, err := m.SnapshotSave(ctx, "m1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Size <= 0 || sn.DiskSize <= 0 || sn.Format != klientapi.VagrantSnapshotFormatLayer {
		t.Errorf("snapshot %+v", sn)
	}
	t.Logf("snapshot of m1: %+v", sn)
	if err := m.SnapshotRestore(ctx, "m1", "nope"); !errors.Is(err, vagrant.ErrSnapshotNotFound) {
		t.Errorf("restore of an unknown snapshot: %v", err)
	}

	// Into its own machine: the file written after the snapshot is gone.
	up("m1")
	sh("m1", "echo after > /root/f && touch /root/new && sync")
	halt("m1")
	if err := m.SnapshotRestore(ctx, "m1", "s1"); err != nil {
		t.Fatal(err)
	}
	up("m1")
	if got := sh("m1", "cat /root/f; ls /root/new 2>&1 || true"); !strings.HasPrefix(got, "saved\n") || !strings.Contains(got, "No such file") {
		t.Errorf("m1 after its restore: %q, want the snapshot's file and no later one", got)
	}

	// Into another machine of the image: the content comes, its identity stays.
	halt("m2")
	if err := m.SnapshotRestore(ctx, "m2", "s1"); err != nil {
		t.Fatal(err)
	}
	up("m2")
	if got := sh("m2", "cat /root/f /etc/kloud/kite.key"); got != "saved\nkey-m2" {
		t.Errorf("m2 after the restore of m1's snapshot: %q, want m1's file and m2's own key", got)
	}

	// A machine of another image (m2 committed: another image id) refuses it, its disk unchanged.
	d.Docker(t, "commit", ids["m2"], "kloud-vagrant-snap:2")
	create("m3", "kloud-vagrant-snap:2")
	sh("m3", "echo m3-own > /root/f && sync")
	halt("m3")
	if err := m.SnapshotRestore(ctx, "m3", "s1"); !errors.Is(err, layersnap.ErrMismatch) {
		t.Errorf("restore into a machine of another image: %v, want a mismatch", err)
	}
	up("m3")
	if got := sh("m3", "cat /root/f"); got != "m3-own" {
		t.Errorf("m3 after the refused restore: %q", got)
	}

	for range 2 {
		if err := m.SnapshotDelete(ctx, "m1", "s1"); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
	if err := m.SnapshotRestore(ctx, "m1", "s1"); !errors.Is(err, vagrant.ErrSnapshotNotFound) {
		t.Errorf("restore after delete: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(home, "snapshots")); len(ents) != 0 {
		t.Errorf("left in the snapshots dir: %v", ents)
	}
}
