package sandbox

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Snapshots of a machine's disk (its overlay upper dir), for the local provider's
// provider.Snapshotter.
//
// A snapshot is one file, StateDir/.snapshots/<snapID>.tar.zst (a name GC never takes for a
// machine: ids do not start with a dot): a PAX tar of the upper dir, zstd-compressed, that keeps
// what the overlay needs: owners, modes, times, hard links, symlinks, device nodes (the overlay's
// whiteouts are 0:0 character devices), fifos and every extended attribute (trusted.overlay.*
// marks opaque directories; security.capability). Its first entry is a PAX global header naming
// the format and the base image the upper dir was made over: an upper dir is only valid over its
// own lower, so RestoreDisk refuses a snapshot of another base image.
//
// Both need the machine stopped (ErrRunning otherwise) and hold its lock, so it cannot start
// meanwhile. SaveDisk writes a temporary file and renames it; RestoreDisk unpacks into a fresh
// directory beside the upper dir and swaps the two with one renameat2(RENAME_EXCHANGE): a crash
// leaves the old disk or the new one, never a mix. The restored disk keeps the target machine's
// identity (IdentityFiles: its machine-id, cloud-init seed and agent key), so a snapshot of one
// machine restored into another boots as that other machine (cloud-init sees its instance-id and
// runs its per-instance modules again, as a cloud image does on a new instance).

// ErrRunning is returned (wrapped) by SaveDisk and RestoreDisk of a running machine.
var ErrRunning = errors.New("sandbox: machine is running (stop it first)")

// ErrSnapshotNotFound is returned (wrapped) by RestoreDisk of a snapshot that does not exist.
var ErrSnapshotNotFound = errors.New("sandbox: snapshot not found")

// SnapshotFormat is the format of the files SaveDisk writes (the PAX global header's
// KLOUD.format).
const SnapshotFormat = "kloud-disk-v1"

const (
	paxFormat    = "KLOUD.format"
	paxBaseImage = "KLOUD.baseImage"
	paxMachine   = "KLOUD.machine"
	paxXattr     = "SCHILY.xattr."
)

// IdentityFiles are the files of the upper dir (relative paths) that make a machine itself
// rather than its content; RestoreDisk keeps the target's.
var IdentityFiles = []string{
	"etc/machine-id",
	"etc/kloud/kite.key",
	"etc/cloud/cloud.cfg.d/90-kloud-seed.cfg",
	"var/lib/cloud/seed/nocloud/meta-data",
	"var/lib/cloud/seed/nocloud/user-data",
}

// DiskSnapshot describes a saved snapshot.
type DiskSnapshot struct {
	ID   string
	Path string
	// Size is the file's size; DiskSize the bytes of regular files saved (uncompressed).
	Size, DiskSize int64
	Files          int
}

// SnapshotPath is where snapshot snapID is kept.
func (m *Manager) SnapshotPath(snapID string) string {
	return filepath.Join(m.stateDir, ".snapshots", snapID+".tar.zst")
}

func validSnapID(id string) error {
	if !idRE.MatchString(id) || strings.Contains(id, ".") {
		return fmt.Errorf("snapshot id %q: want 1-64 characters of [A-Za-z0-9_-], not starting with _ or -", id)
	}
	return nil
}

// SaveDisk saves the disk of stopped machine id as snapshot snapID (replacing one of that id).
func (m *Manager) SaveDisk(ctx context.Context, id, snapID string) (DiskSnapshot, error) {
	if err := validSnapID(snapID); err != nil {
		return DiskSnapshot{}, err
	}
	l, r, err := m.lockRecord(ctx, id, "snapshot machine")
	if err != nil {
		return DiskSnapshot{}, err
	}
	defer l.unlock()
	if alive(r.PID, r.PIDStart) {
		return DiskSnapshot{}, fmt.Errorf("snapshot machine %q: %w", id, ErrRunning)
	}
	if r.DiskMB > 0 { // disk.go
		return DiskSnapshot{}, fmt.Errorf("snapshot machine %q: %w", id, ErrDiskQuota)
	}
	dst := m.SnapshotPath(snapID)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return DiskSnapshot{}, fmt.Errorf("snapshot dir: %w", err)
	}
	tmp := dst + ".tmp-" + randHex()
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return DiskSnapshot{}, fmt.Errorf("snapshot machine %q: %w", id, err)
	}
	out := DiskSnapshot{ID: snapID, Path: dst}
	err = func() error {
		zw, err := zstd.NewWriter(f, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			return err
		}
		tw := tar.NewWriter(zw)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Format: tar.FormatPAX, PAXRecords: map[string]string{
			paxFormat: SnapshotFormat, paxBaseImage: r.BaseImage, paxMachine: r.ID,
		}}); err != nil {
			return err
		}
		if err := writeTree(ctx, tw, filepath.Join(m.machineDir(id), "upper"), &out); err != nil {
			return err
		}
		if err := tw.Close(); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		return f.Sync()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return DiskSnapshot{}, fmt.Errorf("snapshot machine %q: %w", id, err)
	}
	syncDir(filepath.Dir(dst))
	st, err := os.Stat(dst)
	if err != nil {
		return DiskSnapshot{}, fmt.Errorf("snapshot machine %q: %w", id, err)
	}
	out.Size = st.Size()
	m.log.Info("machine disk saved", "machine", id, "snapshot", snapID, "size", out.Size, "disk", out.DiskSize, "files", out.Files)
	return out, nil
}

// DeleteSnapshot removes snapshot snapID (and what an interrupted SaveDisk of it left). A
// missing snapshot is not an error.
func (m *Manager) DeleteSnapshot(ctx context.Context, snapID string) error {
	if err := validSnapID(snapID); err != nil {
		return err
	}
	p := m.SnapshotPath(snapID)
	tmps, _ := filepath.Glob(p + ".tmp-*")
	var errs []error
	for _, f := range append([]string{p}, tmps...) {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete snapshot %q: %w", snapID, err)
	}
	return nil
}

// Snapshots lists the ids of the snapshots kept in the state dir.
func (m *Manager) Snapshots() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(m.stateDir, ".snapshots"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var out []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".tar.zst"); ok && validSnapID(id) == nil {
			out = append(out, id)
		}
	}
	return out, nil
}

// RestoreDisk replaces the disk of stopped machine id by snapshot snapID's, keeping the
// machine's IdentityFiles. The swap is atomic; on error the disk is unchanged.
func (m *Manager) RestoreDisk(ctx context.Context, id, snapID string) error {
	if err := validSnapID(snapID); err != nil {
		return err
	}
	l, r, err := m.lockRecord(ctx, id, "restore machine")
	if err != nil {
		return err
	}
	defer l.unlock()
	if alive(r.PID, r.PIDStart) {
		return fmt.Errorf("restore machine %q: %w", id, ErrRunning)
	}
	if r.DiskMB > 0 { // disk.go
		return fmt.Errorf("restore machine %q: %w", id, ErrDiskQuota)
	}
	dir := m.machineDir(id)
	upper := filepath.Join(dir, "upper")
	// What an interrupted restore left.
	if old, _ := filepath.Glob(filepath.Join(dir, "upper.restore-*")); len(old) > 0 {
		for _, o := range old {
			if err := os.RemoveAll(o); err != nil {
				return fmt.Errorf("restore machine %q: remove leftover %s: %w", id, o, err)
			}
		}
	}
	f, err := os.Open(m.SnapshotPath(snapID))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("restore machine %q from snapshot %q: %w", id, snapID, ErrSnapshotNotFound)
	}
	if err != nil {
		return fmt.Errorf("restore machine %q: %w", id, err)
	}
	defer f.Close()
	tmp := filepath.Join(dir, "upper.restore-"+randHex())
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("restore machine %q: %w", id, err)
	}
	swapped := false
	defer func() {
		if !swapped {
			os.RemoveAll(tmp)
		}
	}()
	if err := extract(ctx, f, tmp, r.BaseImage); err != nil {
		return fmt.Errorf("restore machine %q from snapshot %q: %w", id, snapID, err)
	}
	if err := keepIdentity(upper, tmp, r.BaseImage); err != nil {
		return fmt.Errorf("restore machine %q: keep its identity: %w", id, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, upper, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("restore machine %q: swap disks: %w", id, err)
	}
	swapped = true
	syncDir(dir)
	// tmp now holds the old disk; the overlay's work dir must not hold state of it.
	var errs []error
	if err := os.RemoveAll(tmp); err != nil {
		errs = append(errs, fmt.Errorf("remove the old disk: %w", err))
	}
	work := filepath.Join(dir, "work")
	if err := os.RemoveAll(work); err != nil {
		errs = append(errs, fmt.Errorf("reset work dir: %w", err))
	} else if err := os.Mkdir(work, 0o755); err != nil {
		errs = append(errs, fmt.Errorf("reset work dir: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("restore machine %q (restored; cleanup): %w", id, err)
	}
	m.log.Info("machine disk restored", "machine", id, "snapshot", snapID)
	return nil
}

// writeTree writes dir's tree into tw, the root as "./".
func writeTree(ctx context.Context, tw *tar.Writer, dir string, out *DiskSnapshot) error {
	links := map[[2]uint64]string{}
	n := 0
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		var link string
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode()&fs.ModeSocket != 0:
			return nil // a socket is recreated by whoever listens on it
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = int(st.Uid), int(st.Gid), "", ""
		h.Format = tar.FormatPAX
		h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[key]; ok {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			} else {
				links[key] = h.Name
			}
		}
		xa, err := listXattrs(p)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for k, v := range xa {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[paxXattr+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		out.Files++
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		w, err := io.Copy(tw, src)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		out.DiskSize += w
		return nil
	})
}

// listXattrs returns p's extended attributes (not following a symlink).
func listXattrs(p string) (map[string]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ERANGE) {
		sz, err := unix.Llistxattr(p, nil)
		if err != nil {
			return nil, fmt.Errorf("list xattrs: %w", err)
		}
		buf = make([]byte, sz)
		n, err = unix.Llistxattr(p, buf)
	}
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list xattrs: %w", err)
	}
	var out map[string]string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		sz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			return nil, fmt.Errorf("xattr %s: %w", name, err)
		}
		v := make([]byte, sz)
		if sz > 0 {
			if sz, err = unix.Lgetxattr(p, name, v); err != nil {
				return nil, fmt.Errorf("xattr %s: %w", name, err)
			}
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = string(v[:sz])
	}
	return out, nil
}

// extract unpacks a snapshot into the empty directory dst. Only entries SaveDisk writes are
// accepted; a name that leaves dst (absolute, "..", or under something that is not a directory
// this extraction made) is refused.
func extract(ctx context.Context, r io.Reader, dst, baseImage string) error {
	zr, err := zstd.NewReader(r)
	if err != nil {
		return err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	h, err := tr.Next()
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	if h.Typeflag != tar.TypeXGlobalHeader || h.PAXRecords[paxFormat] != SnapshotFormat {
		return fmt.Errorf("not a snapshot of format %s", SnapshotFormat)
	}
	if b := h.PAXRecords[paxBaseImage]; b != baseImage {
		return fmt.Errorf("the snapshot's disk was made over base image %s, this machine runs on %s: restore it into a machine of the same image", b, baseImage)
	}
	dirs := map[string]bool{".": true} // directories made here: the only valid parents
	type dirMeta struct {
		p   string
		mod time.Time
	}
	var dirTimes []dirMeta
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read snapshot: %w", err)
		}
		if n++; n%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		name := path.Clean(strings.TrimSuffix(h.Name, "/"))
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("snapshot entry %q leaves the disk", h.Name)
		}
		if name != "." && !dirs[path.Dir(name)] {
			return fmt.Errorf("snapshot entry %q: its directory is not in the snapshot before it", h.Name)
		}
		p := filepath.Join(dst, filepath.FromSlash(name))
		mode := uint32(h.Mode & 0o7777)
		switch h.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := os.Mkdir(p, 0o700); err != nil {
					return err
				}
			}
			dirs[name] = true
			dirTimes = append(dirTimes, dirMeta{p, h.ModTime})
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeLink:
			ln := path.Clean(h.Linkname)
			if path.IsAbs(ln) || ln == ".." || strings.HasPrefix(ln, "../") || !dirs[path.Dir(ln)] {
				return fmt.Errorf("snapshot entry %q: hard link to %q leaves the disk", h.Name, h.Linkname)
			}
			if err := os.Link(filepath.Join(dst, filepath.FromSlash(ln)), p); err != nil {
				return err
			}
			continue // the first name carries the metadata
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[h.Typeflag]
			if err := unix.Mknod(p, kind|0o600, int(unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor)))); err != nil {
				return fmt.Errorf("%s: mknod: %w", name, err)
			}
		default:
			return fmt.Errorf("snapshot entry %q: unsupported type %q", h.Name, h.Typeflag)
		}
		if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
			return err
		}
		for k, v := range h.PAXRecords {
			if x, ok := strings.CutPrefix(k, paxXattr); ok {
				if err := unix.Lsetxattr(p, x, []byte(v), 0); err != nil {
					return fmt.Errorf("%s: set xattr %s: %w", name, x, err)
				}
			}
		}
		if h.Typeflag != tar.TypeSymlink {
			// After chown, which clears setuid and setgid.
			if err := unix.Chmod(p, mode); err != nil {
				return fmt.Errorf("%s: chmod: %w", name, err)
			}
		}
		if h.Typeflag != tar.TypeDir {
			ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
			if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("%s: set times: %w", name, err)
			}
		}
	}
	// Directories last (their contents changed their times), deepest first.
	for i := len(dirTimes) - 1; i >= 0; i-- {
		if err := os.Chtimes(dirTimes[i].p, dirTimes[i].mod, dirTimes[i].mod); err != nil {
			return err
		}
	}
	return nil
}

// keepIdentity puts the IdentityFiles of the current disk (cur) into the restored one (dst): the
// snapshot's own are removed, the machine's copied (with their modes and owners). Both disks are
// the machine's content, whose root may have made any path a symlink: every access goes through
// an os.Root, so a symlink never leads outside the disk.
func keepIdentity(cur, dst, lower string) error {
	from, err := os.OpenRoot(cur)
	if err != nil {
		return err
	}
	defer from.Close()
	to, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer to.Close()
	for _, rel := range IdentityFiles {
		if fi, err := to.Lstat(rel); err == nil && !fi.IsDir() {
			if err := to.Remove(rel); err != nil {
				return err
			}
		}
		fi, err := from.Lstat(rel)
		if err != nil || !fi.Mode().IsRegular() {
			continue // missing, unreachable or not a file: the machine has none to keep
		}
		b, err := from.ReadFile(rel)
		if err != nil {
			return err
		}
		if err := mkdirLikeIn(to, lower, filepath.Dir(rel)); err != nil {
			return err
		}
		if err := to.WriteFile(rel, b, fi.Mode().Perm()); err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if err := to.Lchown(rel, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if err := to.Chmod(rel, fi.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// mkdirLikeIn is mkdirLike inside root: missing directories of rel are made with the mode and
// owner they have in lower.
func mkdirLikeIn(root *os.Root, lower, rel string) error {
	cur := ""
	for _, part := range strings.Split(filepath.Clean(rel), "/") {
		if part == "." || part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		if _, err := root.Stat(cur); err == nil {
			continue
		}
		mode, uid, gid := os.FileMode(0o755), 0, 0
		if st, err := os.Stat(filepath.Join(lower, cur)); err == nil && st.IsDir() {
			mode = st.Mode().Perm() | st.Mode()&os.ModeSticky
			if s, ok := st.Sys().(*syscall.Stat_t); ok {
				uid, gid = int(s.Uid), int(s.Gid)
			}
		}
		if err := root.Mkdir(cur, mode); err != nil {
			return err
		}
		if err := root.Chmod(cur, mode); err != nil {
			return err
		}
		if err := root.Lchown(cur, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

func randHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// syncDir fsyncs a directory (a rename in it), best effort.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
