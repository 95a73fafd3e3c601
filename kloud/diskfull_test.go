package kloud_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
)

// smallFS mounts a new ext4 filesystem of mb megabytes (a file in a temp dir, loop-mounted) and
// returns its mount point; it is unmounted (and its loop device freed) when the test ends, also
// when it fails.
func smallFS(t *testing.T, mb int) string {
	t.Helper()
	testutil.RequireRoot(t)
	for _, b := range []string{"mkfs.ext4", "mount", "umount"} {
		testutil.RequireBinary(t, b)
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(mb) << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	// -o loop attaches a loop device with autoclear: it is freed at the unmount.
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		testutil.Unavailable(t, "cannot loop-mount a filesystem: %v: %s", err, out)
	}
	// Registered after t.TempDir's removal, so it runs before it (cleanups run last first).
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s; unmounting lazily", mnt, err, out)
			exec.Command("umount", "-l", mnt).Run()
		}
	})
	return mnt
}

// fill writes dir/filler until the filesystem has no space left.
func fill(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for small := make([]byte, 4096); ; { // the last blocks
		if _, err := f.Write(small); err != nil {
			break
		}
	}
	f.Sync()
	return p
}

// TestDataDirDiskFull: kloud with its data directory (the embedded store) on a small filesystem
// that fills up: writes fail with a clear error naming the full disk (no panic, no hang), reads
// go on, nothing written before is lost, and once there is space again writes work with no
// restart; a restart on the same data then finds everything (issue 23).
func TestDataDirDiskFull(t *testing.T) {
	t.Parallel()
	dir := smallFS(t, 64)
	e := kloudtest.Start(t, kloudtest.Options{DataDir: dir, EmbeddedStore: true})
	admin := e.Client(kloud.Admin)
	ctx := t.Context()
	add := func(name string) error {
		_, err := admin.UserAdd(ctx, api.UserAddParams{Username: name, Team: model.DefaultTeam})
		return err
	}
	if err := add("before"); err != nil {
		t.Fatal(err)
	}
	filler := fill(t, dir)

	var full error
	for i := range 20 { // a write may still fit in a page the database has free
		if full = add("full" + string(rune('a'+i))); full != nil {
			break
		}
	}
	t.Logf("a write on a full disk: %v", full)
	if full == nil {
		t.Fatal("20 writes on a full disk all succeeded")
	}
	if msg := full.Error(); !strings.Contains(msg, "its disk is full, nothing was written") || !errors.Is(full, kite.ErrStoreUnavailable) {
		t.Errorf("a write on a full disk: %q, want storeUnavailable saying the disk is full", msg)
	}
	users, err := admin.UserList(ctx)
	if err != nil {
		t.Fatalf("a read on a full disk: %v", err)
	}
	if !hasUser(users.Users, "before") {
		t.Fatalf("the user written before the disk filled is gone: %+v", users)
	}

	// Space returns: writes work again, no restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := add("after"); err != nil {
		t.Fatalf("a write once space returned: %v", err)
	}
	// A restart on the same data finds all of it (the store was not corrupted).
	e.Stop()
	e = kloudtest.Start(t, kloudtest.Options{DataDir: dir, EmbeddedStore: true})
	users, err = e.Client(kloud.Admin).UserList(ctx)
	if err != nil || !hasUser(users.Users, "before") || !hasUser(users.Users, "after") {
		t.Fatalf("users after a restart: %+v %v", users, err)
	}
}

func hasUser(us []api.UserView, name string) bool {
	for _, u := range us {
		if u.Username == name {
			return true
		}
	}
	return false
}
