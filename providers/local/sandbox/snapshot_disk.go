package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Snapshots of machines with a disk quota (disk.go): their upper and work dirs live inside the
// ext4 image, which is mounted only inside the running machine's own mount namespace. SaveDisk
// and RestoreDisk of such a (stopped) machine mount the image themselves, in a mount namespace of
// their own: a goroutine locks its OS thread, unshares the mount namespace (made private, so
// nothing propagates to the host), loop-mounts the image on the machine's mount point there, does
// the work on that thread and unmounts; the thread then ends with the goroutine (it is never
// unlocked), and its namespace with it. So the host's mount table never shows the disk, and a
// kloud killed mid-operation leaves no mount and no loop device (autoclear) behind.
//
// The restore unpacks beside the upper dir inside the image and swaps the two there, so the
// quota holds during and after it: a snapshot bigger than the disk (or than what the disk has
// free next to the current content: both exist until the swap) fails with ENOSPC and leaves the
// disk as it was.

// withDisk calls fn with the directory holding the stopped machine r's upper and work dirs: the
// machine dir, or its disk image mounted (read-only if ro) in a private mount namespace, fn
// running on the one thread that sees it. fn must not start goroutines that touch those files.
func (m *Manager) withDisk(r *record, ro bool, fn func(root string) error) error {
	dir := m.machineDir(r.ID)
	if r.DiskMB <= 0 {
		return fn(dir)
	}
	img, mnt := filepath.Join(dir, diskImage), filepath.Join(dir, diskMount)
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, whose mount namespace is not the process's, ends with
		// this goroutine.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("mount the disk image: unshare the mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("mount the disk image: make the mount namespace private: %w", err)
			}
			if err := mountImage(img, mnt, ro); err != nil { // forked from this thread: in its namespace
				return err
			}
			err := fn(mnt)
			if uerr := unix.Unmount(mnt, 0); uerr != nil {
				err = errors.Join(err, fmt.Errorf("unmount the disk image: %w", uerr))
			}
			return err
		}()
	}()
	return <-errc
}

// mountBinary is mount(8): init has no PATH, so the host's usual places first.
func mountBinary() string {
	for _, p := range []string{"/usr/bin/mount", "/bin/mount", "/usr/sbin/mount", "/sbin/mount"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "mount"
}
