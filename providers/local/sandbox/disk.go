package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// A machine's disk quota (Spec.DiskMB): without one, the machine's writable layer (the overlay's
// upper dir, StateDir/<id>/upper) is a directory of the state dir's filesystem and may fill it.
// With one, it lives in an ext4 image of that size, StateDir/<id>/disk.img (sparse: it takes
// what the machine wrote), which init loop-mounts at StateDir/<id>/disk inside the machine's own
// mount namespace before the overlay (upper: disk/upper, work: disk/work). So writes beyond the
// quota fail with ENOSPC, df inside the machine shows the quota (an overlay reports its upper
// filesystem's size), and nothing new runs on the host: the mount and its loop device (autoclear)
// go away with the machine's last process, like the overlay. Create fills the image from the
// seed it wrote (mke2fs -d), so no mount is ever made in the host's namespace.
//
// Needs mkfs.ext4 (e2fsprogs) and mount (util-linux) with loop devices; Create refuses a quota
// without them.

// Disk layout names, in the machine dir.
const (
	diskImage = "disk.img"
	diskMount = "disk"
)

// MinDiskMB is the smallest disk quota (ext4's journal and cloud-init's first writes need room).
const MinDiskMB = 64

// checkDiskTools says what a disk quota needs that this host lacks.
func checkDiskTools() error {
	for _, b := range []string{"mkfs.ext4", "mount"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("a disk quota needs %s (e2fsprogs, util-linux): %w", b, err)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("a disk quota needs loop devices: %w", err)
	}
	return nil
}

// makeDiskImage moves the prepared upper/ and work/ of machine dir into a new ext4 image of
// sizeMB and makes the mount point.
func makeDiskImage(ctx context.Context, dir string, sizeMB int) error {
	seed := filepath.Join(dir, ".disk-seed")
	if err := os.Mkdir(seed, 0o700); err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	defer os.RemoveAll(seed)
	for _, d := range []string{"upper", "work"} {
		if err := os.Rename(filepath.Join(dir, d), filepath.Join(seed, d)); err != nil {
			return fmt.Errorf("disk image: %w", err)
		}
	}
	// -d copies the seed with its owners and modes; root_owner: the fs root stays root's 0755.
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "kloud-disk", "-E", "root_owner=0:0",
		"-d", seed, filepath.Join(dir, diskImage), strconv.Itoa(sizeMB)+"M").CombinedOutput()
	if err != nil {
		return fmt.Errorf("disk image: mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Mkdir(filepath.Join(dir, diskMount), 0o755); err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	return nil
}

// mountDisk loop-mounts the machine's disk image (init, in the machine's mount namespace).
func mountDisk(cfg *bootConfig) error {
	if cfg.DiskImage == "" {
		return nil
	}
	return mountImage(cfg.DiskImage, cfg.DiskMount, false)
}

// mountImage loop-mounts the ext4 disk image img on mnt (nosuid, nodev; read-only if ro) with
// mount(8), forked from the calling thread: the mount lands in that thread's mount namespace.
func mountImage(img, mnt string, ro bool) error {
	opts := "loop,nosuid,nodev"
	if ro {
		opts += ",ro"
	}
	out, err := exec.Command(mountBinary(), "-t", "ext4", "-o", opts, img, mnt).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount the disk image %s: %w: %s", img, err, strings.TrimSpace(string(out)))
	}
	return nil
}
