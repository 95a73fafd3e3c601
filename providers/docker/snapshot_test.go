package docker_test

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/docker"
	"github.com/kloud-dev/kloud/providers/docker/dockertest"
)

// Snapshots of docker machines on a private daemon (its storage on this host, overlay2):
// advertised; a running container is refused; a stopped one's layer is saved and restored
// exactly (contents, hard and symbolic links, setuid bits, the overlay's whiteouts and opaque
// directories) into the same container and into another one, which keeps its identity (seed,
// kite key, machine-id) and never lets a symlink of its own lead the restore to the host; a
// container of another image is refused and left as it was. The same daemon reached over TCP is
// not offered snapshots.
func TestSnapshotRestore(t *testing.T) {
	t.Parallel()
	dd := dockertest.New(t)
	ctx := t.Context()
	d, err := docker.New(docker.Options{Host: dd.Host, Image: dd.Image, Instance: "snaptest", StateDir: t.TempDir(), Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SnapshotsWhyNot(); err != nil || !d.Provider().Can(provider.CapSnapshot) {
		t.Fatalf("snapshots on a local overlay2 daemon: %v (caps %v)", err, d.Provider().Caps())
	}

	// A daemon that does not answer when the provider is made (kloud started first): no
	// snapshots, describe says so too; offered as soon as it answers (asked again on describe),
	// and usable then (below).
	sp := newSockProxy(t, strings.TrimPrefix(dd.Host, "unix://"))
	sp.setDown(true)
	late, err := docker.New(docker.Options{Host: sp.host, Image: dd.Image, Instance: "snaptest", StateDir: t.TempDir(), Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	described := func() bool {
		return slices.Contains(provider.Describe(late.Provider()).Capabilities, provider.CapSnapshot)
	}
	if err := late.SnapshotsWhyNot(); err == nil || late.Provider().Can(provider.CapSnapshot) || described() {
		t.Fatalf("snapshots offered while the daemon does not answer: %v (caps %v)", err, late.Provider().Caps())
	}
	t.Logf("daemon down: %v", late.SnapshotsWhyNot())
	sp.setDown(false)
	testutil.Eventually(t, 30*time.Second, described, "the daemon answers again, but describe offers no snapshots")
	if err := late.SnapshotsWhyNot(); err != nil || !late.Provider().Can(provider.CapSnapshot) {
		t.Fatalf("the daemon answers again: %v (caps %v)", err, late.Provider().Caps())
	}

	// The same daemon through a TCP forwarder on loopback: it answers, but its layers are not
	// known to be here.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("unix", strings.TrimPrefix(dd.Host, "unix://"))
				if err != nil {
					return
				}
				defer u.Close()
				go io.Copy(u, c)
				io.Copy(c, u)
			}()
		}
	}()
	remote, err := docker.New(docker.Options{Host: "tcp://" + ln.Addr().String(), Image: dd.Image, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Available(); err != nil {
		t.Fatalf("the daemon over TCP: %v", err)
	}
	if err := remote.SnapshotsWhyNot(); err == nil || remote.Provider().Can(provider.CapSnapshot) {
		t.Fatalf("snapshots offered for a daemon over TCP (caps %v)", remote.Provider().Caps())
	} else {
		t.Logf("over TCP: %v", err)
	}

	create := func(name, image string) provider.Machine {
		t.Helper()
		id := strings.TrimSpace(dd.Docker(t, "create", "--name", name, "--network", "none", "--label", docker.LabelInstance+"=snaptest",
			"--label", docker.LabelMachine+"="+name, "--entrypoint", "sleep", image, "infinity"))
		m, err := d.Provider().Machine(&provider.BaseMachine{ID: name, Label: "vm." + name, Attributes: map[string]any{"id": id}})
		if err != nil {
			t.Fatal(err)
		}
		dd.Docker(t, "start", name)
		dd.Docker(t, "exec", name, "sh", "-ec", `mkdir -p /etc/kloud /var/lib/cloud/seed/nocloud /usr/local/sbin
echo `+name+` > /etc/machine-id; echo key-`+name+` > /etc/kloud/kite.key; echo "instance-id: `+name+`" > /var/lib/cloud/seed/nocloud/meta-data
echo boot > /usr/local/sbin/kloud-boot; sync`)
		return m
	}
	exec := func(name, script string) string {
		t.Helper()
		return strings.TrimSpace(dd.Docker(t, "exec", name, "sh", "-c", script))
	}
	a := create("snap-a", dd.Image)
	b := create("snap-b", dd.Image)
	sa, sb := a.(provider.Snapshotter), b.(provider.Snapshotter)
	exec("snap-a", `set -e
echo v1 > /root/keep.txt
ln -s keep.txt /root/link
ln /root/keep.txt /root/hard
cp /bin/true /root/suid && chmod 4755 /root/suid
rm /etc/issue
rm -rf /usr/share/doc/bash && mkdir /usr/share/doc/bash && echo mine > /usr/share/doc/bash/only
sync`)
	if _, err := sa.Snapshot(ctx, "s1"); !errors.Is(err, provider.ErrRunning) {
		t.Fatalf("snapshot of a running container: %v, want ErrRunning", err)
	}
	stop := func(name string) { t.Helper(); dd.Docker(t, "stop", "-t", "0", name) }
	start := func(name string) { t.Helper(); dd.Docker(t, "start", name) }
	stop("snap-a")
	info, err := sa.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %+v", info)
	// Through the provider made while the daemon was down.
	lm, err := late.Provider().Machine(&provider.BaseMachine{ID: "snap-a", Label: "vm.snap-a", Attributes: map[string]any{"id": "snap-a"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lm.(provider.Snapshotter).Snapshot(ctx, "s-late"); err != nil {
		t.Fatalf("snapshot through the provider made while the daemon was down: %v", err)
	}
	if err := late.DeleteSnapshot("s-late"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(d.SnapshotPath("s1")); err != nil || st.Size() != info.Size || info.DiskSize <= 0 || info.Format != docker.SnapshotFormat {
		t.Fatalf("snapshot file: %v %v, info %+v", st, err, info)
	}

	start("snap-a")
	exec("snap-a", "echo v2 > /root/keep.txt; touch /root/later; echo back > /etc/issue; sync")
	if err := sa.Restore(ctx, "s1"); !errors.Is(err, provider.ErrRunning) {
		t.Fatalf("restore into a running container: %v, want ErrRunning", err)
	}
	stop("snap-a")
	if err := sa.Restore(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	start("snap-a")
	const checkScript = `cat /root/keep.txt; readlink /root/link; stat -c %h /root/hard; stat -c %a /root/suid
test -e /root/later && echo LATER; test -e /etc/issue && echo ISSUE; ls /usr/share/doc/bash`
	const want = "v1\nkeep.txt\n2\n4755\nonly"
	if got := exec("snap-a", checkScript); got != want {
		t.Errorf("snap-a after restore:\n%s\nwant\n%s", got, want)
	}

	// Into snap-b, whose /etc/kloud its root made a symlink to a host directory.
	host := t.TempDir()
	sentinel := filepath.Join(host, "kite.key")
	if err := os.WriteFile(sentinel, []byte("host's"), 0o600); err != nil {
		t.Fatal(err)
	}
	exec("snap-b", "rm -rf /etc/kloud && ln -s "+host+" /etc/kloud && sync")
	stop("snap-b")
	if err := sb.Restore(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(sentinel); err != nil || string(got) != "host's" {
		t.Fatalf("the host file behind the machine's symlink: %q %v", got, err)
	}
	if ents, _ := os.ReadDir(host); len(ents) != 1 {
		t.Fatalf("the host dir behind the machine's symlink holds %d entries", len(ents))
	}
	start("snap-b")
	if got := exec("snap-b", checkScript); got != want {
		t.Errorf("snap-b after restore:\n%s\nwant\n%s", got, want)
	}
	if got := exec("snap-b", "cat /etc/machine-id /var/lib/cloud/seed/nocloud/meta-data; test -e /etc/kloud/kite.key && echo KEY; true"); got != "snap-b\ninstance-id: snap-b" {
		t.Errorf("snap-b's identity after restore: %q", got)
	}

	// A container of another image (snap-a committed) is refused and keeps its disk.
	dd.Docker(t, "commit", "snap-a", "kloud-snaptest-other")
	c := create("snap-c", "kloud-snaptest-other")
	exec("snap-c", "echo c > /root/keep.txt; sync")
	stop("snap-c")
	err = c.(provider.Snapshotter).Restore(ctx, "s1")
	if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "image") {
		t.Fatalf("restore into a container of another image: %v", err)
	}
	t.Logf("another image: %v", err)
	start("snap-c")
	if got := exec("snap-c", "cat /root/keep.txt"); got != "c" {
		t.Errorf("snap-c after the refused restore: %q", got)
	}
	// Nothing left beside the layers.
	res, err := dd.Client.ContainerInspect(ctx, "snap-c", client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(res.Container.GraphDriver.Data["UpperDir"])), "*", "diff.restore-*")); len(left) != 0 {
		t.Fatalf("left beside the layers: %v", left)
	}

	if err := sa.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := sa.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatalf("delete again: %v", err)
	}
	stop("snap-a")
	if err := sa.Restore(ctx, "s1"); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("restore of a deleted snapshot: %v", err)
	}
	if _, err := sa.Snapshot(ctx, "../x"); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("snapshot id ../x: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(d.SnapshotPath("x"))); len(ents) != 0 {
		t.Fatalf("snapshot dir after delete: %v", ents)
	}
	for _, n := range []string{"snap-a", "snap-b", "snap-c"} {
		dd.Docker(t, "rm", "-f", n)
	}
	dd.Docker(t, "rmi", "kloud-snaptest-other")
}
