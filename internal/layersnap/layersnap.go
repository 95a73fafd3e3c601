// Package layersnap saves and restores the writable layer of an overlay filesystem (an overlay
// "upper dir": the local provider's machine disks, a docker container's overlay2 diff dir) as
// one stream: a PAX tar, zstd-compressed, that keeps what the overlay needs: owners, modes,
// times, hard links, symlinks, device nodes (the overlay's whiteouts are 0:0 character devices),
// fifos and every extended attribute (trusted.overlay.* marks opaque directories;
// security.capability). Sockets are skipped (whoever listens on one makes it again).
//
// The stream's first entry is a PAX global header naming the format (Format) and the caller's
// metadata (SaveOptions.Meta, e.g. the base image the layer was made over: a layer is only valid
// over its own lower layers); Restore refuses a stream whose metadata differs from
// RestoreOptions.Match (ErrMismatch).
//
// Restore never writes into the live upper dir: it unpacks into a fresh directory beside it (same
// parent, so the same filesystem: <upper>.restore-<random>), copies the target's own files named
// in RestoreOptions.KeepPaths (identity: machine-id, agent key, cloud-init seed) into it, swaps
// the two directories with one renameat2(RENAME_EXCHANGE) and removes the old layer. A crash
// leaves the old layer or the new one, never a mix (what it left beside is removed by the next
// Restore); an error before the swap (a bad stream, ENOSPC, a cancelled ctx) leaves the upper
// dir as it was. The caller makes sure nothing uses the layer meanwhile (the overlay is not
// mounted: the machine or container is stopped) and that the old and the new layer fit side by
// side on the upper dir's filesystem.
//
// The stream is untrusted input: entries that would leave the new directory (absolute names,
// "..", a path under a symlink or under anything that is not a directory the stream made before,
// a hard link to outside) are refused, and KeepPaths are copied through os.Root, so a symlink the
// layer's owner planted never leads outside either layer.
//
// Start reading at Save and Restore (SaveFile and RemoveFile keep a snapshot as a file written
// atomically). A stream cut short, even cleanly between two entries, is refused; runs of zeros
// are restored as holes (a sparse file stays sparse). Needs Linux; restoring owners, device nodes and trusted.*
// attributes needs root (CAP_CHOWN, CAP_MKNOD, CAP_SYS_ADMIN).
package layersnap

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/internal/atomicfile"
)

// Format is the format of the streams Save writes (the global header's KLOUD.format record).
// It is also what the local provider's snapshots of earlier releases carry: they restore as is.
const Format = "kloud-disk-v1"

const (
	paxPrefix = "KLOUD."
	paxFormat = paxPrefix + "format"
	paxXattr  = "SCHILY.xattr."
)

// ErrMismatch is returned (wrapped, in a *MismatchError) by Restore of a stream whose metadata
// differs from RestoreOptions.Match.
var ErrMismatch = errors.New("layersnap: snapshot made for another target")

// MismatchError says which metadata key differs.
type MismatchError struct {
	Key  string // the SaveOptions.Meta key
	Have string // the stream's value ("" if it has none)
	Want string // RestoreOptions.Match's value
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("the snapshot's %s is %q, the target's is %q: restore it into a target with the same %s", e.Key, e.Have, e.Want, e.Key)
}

// Unwrap makes errors.Is(err, ErrMismatch) true.
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// Info says what Save wrote.
type Info struct {
	// DiskSize is the bytes of regular files saved (uncompressed, each hard-linked file once).
	DiskSize int64 `json:"diskSize"`
	// Files is the number of entries (files, directories, links, devices) saved.
	Files int `json:"files"`
	// Size is the snapshot file's size (SaveFile; 0 from Save).
	Size int64 `json:"size,omitempty"`
}

// SaveOptions tune Save. The zero value is valid.
type SaveOptions struct {
	// Meta is written into the stream's header (keys: letters, digits, '_' and '-'), read back
	// by ReadMeta and compared by RestoreOptions.Match. Default: none.
	Meta map[string]string
	// Level is the zstd level. Default zstd.SpeedFastest (the stream is written while the
	// machine is stopped: speed matters more than a few percent of size).
	Level zstd.EncoderLevel
	// BeforeCommit, if set, is called after the whole tree is read, before the stream is
	// finished: an error fails Save, leaving an incomplete stream that Restore refuses (SaveFile
	// removes it), e.g. the container was started meanwhile. Default: none.
	BeforeCommit func() error
}

// RestoreOptions tune Restore. The zero value is valid.
type RestoreOptions struct {
	// Match lists metadata the stream must carry with these values (ErrMismatch otherwise).
	Match map[string]string
	// KeepPaths are files (relative to the upper dir, e.g. "etc/machine-id") that the restored
	// layer takes from the current one instead of the stream: the stream's are removed, the
	// current ones (regular files only, at most MaxKeepSize bytes, else the restore fails; a
	// missing one is skipped) are copied with their mode and owner. Missing parent directories are made like LowerDir's (mode, owner), else 0755 root.
	KeepPaths []string
	// LowerDir is the merged lower layer the upper dir is over (only read, for KeepPaths'
	// parents). Default: none.
	LowerDir string
	// WorkDir is the overlay's work dir of this upper dir; after the swap its contents are
	// removed (the overlay's work dir must not hold state of the old layer). Default: none.
	WorkDir string
	// BeforeSwap, if set, is called after the stream is unpacked, right before the swap: an
	// error aborts the restore with the upper dir unchanged (e.g. the container was started
	// meanwhile). Default: none.
	BeforeSwap func() error
}

// MaxKeepSize is the largest file RestoreOptions.KeepPaths copies (identity files are small; the
// layer's owner could make one huge).
const MaxKeepSize = 1 << 20

var metaKeyRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Save writes the tree of upperDir to w as a snapshot stream. upperDir's root entry is "./".
// Nothing must write into upperDir meanwhile (the overlay is unmounted). A cancelled ctx stops
// it between files; w then holds a partial stream (write to a temporary file and rename it).
func Save(ctx context.Context, upperDir string, w io.Writer, opt SaveOptions) (Info, error) {
	var out Info
	recs := map[string]string{paxFormat: Format}
	for k, v := range opt.Meta {
		if !metaKeyRE.MatchString(k) {
			return out, fmt.Errorf("save layer: metadata key %q: want 1-64 characters of [A-Za-z0-9_-]", k)
		}
		recs[paxPrefix+k] = v
	}
	if fi, err := os.Lstat(upperDir); err != nil {
		return out, fmt.Errorf("save layer: %w", err)
	} else if !fi.IsDir() {
		return out, fmt.Errorf("save layer: %s is not a directory", upperDir)
	}
	level := opt.Level
	if level == 0 {
		level = zstd.SpeedFastest
	}
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(level))
	if err != nil {
		return out, fmt.Errorf("save layer: %w", err)
	}
	defer zw.Close()
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Format: tar.FormatPAX, PAXRecords: recs}); err != nil {
		return out, fmt.Errorf("save layer: %w", err)
	}
	if err := writeTree(ctx, tw, upperDir, &out); err != nil {
		return out, fmt.Errorf("save layer %s: %w", upperDir, err)
	}
	if opt.BeforeCommit != nil {
		if err := opt.BeforeCommit(); err != nil {
			return out, fmt.Errorf("save layer %s: %w", upperDir, err)
		}
	}
	if err := tw.Close(); err != nil {
		return out, fmt.Errorf("save layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return out, fmt.Errorf("save layer: %w", err)
	}
	return out, nil
}

// SaveFile saves upperDir as the snapshot file path (mode 0600), atomically (internal/atomicfile:
// Save into a temporary file beside it, fsync, rename over path, replacing a snapshot of that
// name, fsync of the directory). On error nothing of it is left. The directory is made (0700) if
// missing.
func SaveFile(ctx context.Context, upperDir, path string, opt SaveOptions) (Info, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return Info{}, fmt.Errorf("save layer: %w", err)
	}
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return Info{}, fmt.Errorf("save layer: %w", err)
	}
	defer f.Cleanup()
	info, err := Save(ctx, upperDir, f, opt)
	if err == nil {
		err = f.Commit()
	}
	if err != nil {
		return Info{}, fmt.Errorf("save layer: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return Info{}, fmt.Errorf("save layer: %w", err)
	}
	info.Size = st.Size()
	return info, nil
}

// RemoveFile removes the snapshot file path and what an interrupted SaveFile of it left. A
// missing file is not an error.
func RemoveFile(path string) error {
	errs := []error{atomicfile.RemoveTemps(path)}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove snapshot: %w", err)
	}
	return nil
}

// ReadMeta reads the metadata (SaveOptions.Meta) from the start of a snapshot stream.
func ReadMeta(r io.Reader) (map[string]string, error) {
	zr, err := newDecoder(r)
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	defer zr.Close()
	return readHeader(tar.NewReader(zr))
}

func readHeader(tr *tar.Reader) (map[string]string, error) {
	h, err := tr.Next()
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	if h.Typeflag != tar.TypeXGlobalHeader || h.PAXRecords[paxFormat] != Format {
		return nil, fmt.Errorf("read snapshot: not a snapshot of format %s", Format)
	}
	meta := map[string]string{}
	for k, v := range h.PAXRecords {
		if key, ok := strings.CutPrefix(k, paxPrefix); ok && k != paxFormat {
			meta[key] = v
		}
	}
	return meta, nil
}

// Restore replaces the tree of upperDir by the snapshot stream r (see the package doc: unpacked
// beside, KeepPaths kept, swapped atomically, the old layer removed). On an error before the swap
// upperDir is unchanged; an error after it (cleanup of the old layer or the work dir) says so.
func Restore(ctx context.Context, r io.Reader, upperDir string, opt RestoreOptions) error {
	upperDir = filepath.Clean(upperDir)
	if fi, err := os.Lstat(upperDir); err != nil {
		return fmt.Errorf("restore layer: %w", err)
	} else if !fi.IsDir() {
		return fmt.Errorf("restore layer: %s is not a directory", upperDir)
	}
	for _, p := range opt.KeepPaths {
		if !filepath.IsLocal(p) {
			return fmt.Errorf("restore layer: keep path %q is not a relative path inside the layer", p)
		}
	}
	if err := RemoveLeftovers(upperDir); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(upperDir), filepath.Base(upperDir)+".restore-*")
	if err != nil {
		return fmt.Errorf("restore layer: %w", err)
	}
	swapped := false
	defer func() {
		if !swapped {
			os.RemoveAll(tmp)
		}
	}()
	if err := extract(ctx, r, tmp, opt.Match); err != nil {
		return fmt.Errorf("restore layer: %w", err)
	}
	if err := keepPaths(upperDir, tmp, opt.LowerDir, opt.KeepPaths); err != nil {
		return fmt.Errorf("restore layer: keep the target's files: %w", err)
	}
	syncTree(tmp)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("restore layer: %w", err)
	}
	if opt.BeforeSwap != nil {
		if err := opt.BeforeSwap(); err != nil {
			return fmt.Errorf("restore layer: %w", err)
		}
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, upperDir, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("restore layer: swap layers: %w", err)
	}
	swapped = true
	syncDir(filepath.Dir(upperDir))
	// tmp now holds the old layer.
	var errs []error
	if err := os.RemoveAll(tmp); err != nil {
		errs = append(errs, fmt.Errorf("remove the old layer: %w", err))
	}
	if opt.WorkDir != "" {
		if err := emptyDir(opt.WorkDir); err != nil {
			errs = append(errs, fmt.Errorf("reset the work dir: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("restore layer %s (restored; cleanup): %w", upperDir, err)
	}
	return nil
}

// RemoveLeftovers removes what an interrupted Restore of upperDir left beside it.
func RemoveLeftovers(upperDir string) error {
	old, _ := filepath.Glob(filepath.Clean(upperDir) + ".restore-*")
	for _, o := range old {
		if err := os.RemoveAll(o); err != nil {
			return fmt.Errorf("restore layer: remove leftover %s: %w", o, err)
		}
	}
	return nil
}

// emptyDir removes dir's contents, keeping dir (its mode and owner).
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// writeTree writes dir's tree into tw, the root as "./".
func writeTree(ctx context.Context, tw *tar.Writer, dir string, out *Info) error {
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
		// Exactly the size the header promised: a file that changed meanwhile is an error, not a
		// corrupt stream.
		w, err := io.Copy(tw, io.LimitReader(src, h.Size))
		if err == nil && w != h.Size {
			err = fmt.Errorf("file shrank while saving (%d of %d bytes): is the layer in use?", w, h.Size)
		}
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

// extract unpacks a snapshot stream into the empty directory dst. Only entries Save writes are
// accepted; a name that leaves dst (absolute, "..", or under something that is not a directory
// this extraction made) is refused.
func extract(ctx context.Context, r io.Reader, dst string, match map[string]string) error {
	zr, err := newDecoder(r)
	if err != nil {
		return err
	}
	defer zr.Close()
	// archive/tar ends at a clean cut between entries as at the end of the archive: the two zero
	// blocks that end it must have been read after the last entry, or the stream is incomplete.
	cr := &countingReader{r: zr}
	tr := tar.NewReader(cr)
	meta, err := readHeader(tr)
	if err != nil {
		return err
	}
	entryEnd := cr.n // where the last entry's data (padded to a block) ends
	for k, want := range match {
		if have := meta[k]; have != want {
			return &MismatchError{Key: k, Have: have, Want: want}
		}
	}
	buf := make([]byte, sparseChunk)
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
			if cr.n < entryEnd+2*blockSize {
				return fmt.Errorf("read snapshot: %w (the archive's end is missing)", io.ErrUnexpectedEOF)
			}
			break
		}
		if err != nil {
			return fmt.Errorf("read snapshot: %w", err)
		}
		entryEnd = cr.n + (h.Size+blockSize-1)/blockSize*blockSize
		if n++; n%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		name := path.Clean(strings.TrimSuffix(h.Name, "/"))
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("snapshot entry %q leaves the layer", h.Name)
		}
		if name != "." && !dirs[path.Dir(name)] {
			return fmt.Errorf("snapshot entry %q: its directory is not in the snapshot before it", h.Name)
		}
		if name == "." && h.Typeflag != tar.TypeDir {
			return fmt.Errorf("snapshot entry %q: the root is not a directory", h.Name)
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
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
			if err != nil {
				return err
			}
			err = copySparse(ctx, f, tr, h.Size, buf)
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
			if path.IsAbs(ln) || ln == "." || ln == ".." || strings.HasPrefix(ln, "../") || !dirs[path.Dir(ln)] {
				return fmt.Errorf("snapshot entry %q: hard link to %q leaves the layer", h.Name, h.Linkname)
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

const blockSize = 512 // tar's

// MaxWindow is the largest zstd window a snapshot stream may declare: twice what Save's encoder
// uses at any level (8 MiB). The decoder allocates about twice the window a frame declares, up to
// 512 MiB by default: a 10-byte hostile stream made Restore allocate 513 MiB (FuzzRestore).
const MaxWindow = 16 << 20

// newDecoder reads a snapshot stream's zstd frames, refusing windows over MaxWindow.
func newDecoder(r io.Reader) (*zstd.Decoder, error) {
	return zstd.NewReader(r, zstd.WithDecoderMaxWindow(MaxWindow), zstd.WithDecoderConcurrency(1))
}

// sparseChunk is the unit copySparse leaves a hole for when it is all zeros.
const sparseChunk = 64 << 10

// copySparse copies size bytes from r to the new file f, seeking over chunks of zeros instead of
// writing them: a file saved from a sparse file (or with long runs of zeros) is restored sparse,
// not as that many bytes on the disk. A cancelled ctx stops it between chunks: one entry of a
// hostile stream may declare terabytes (TestRestoreCancelledStopsInsideAnEntry: a cancelled
// Restore of a 32 KiB stream wrote out its 1 GiB entry, 4 s, before it returned).
func copySparse(ctx context.Context, f *os.File, r io.Reader, size int64, buf []byte) error {
	var off int64
	for off < size {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		if err != nil {
			return err
		}
		if allZero(buf[:n]) {
			off += int64(n)
			continue
		}
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			return err
		}
		off += int64(n)
	}
	return f.Truncate(size) // the length, when it ends in a hole
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// countingReader counts what was read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// keepPaths puts the files rels of the current layer (cur) into the restored one (dst): the
// stream's own are removed, the current ones copied (with their modes and owners). Both layers
// are content their owner controls, whose root may have made any path a symlink: every access
// goes through an os.Root, so a symlink never leads outside the layer.
func keepPaths(cur, dst, lower string, rels []string) error {
	if len(rels) == 0 {
		return nil
	}
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
	for _, rel := range rels {
		if fi, err := to.Lstat(rel); err == nil && !fi.IsDir() {
			if err := to.Remove(rel); err != nil {
				return err
			}
		}
		fi, err := from.Lstat(rel)
		if err != nil || !fi.Mode().IsRegular() {
			continue // missing, unreachable or not a file: the target has none to keep
		}
		// The layer's owner could have made it huge (a sparse file): never read more than
		// MaxKeepSize into memory.
		if fi.Size() > MaxKeepSize {
			return fmt.Errorf("%s is %d bytes, more than the %d a kept file may have", rel, fi.Size(), MaxKeepSize)
		}
		b, err := readAtMost(from, rel, MaxKeepSize)
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

// readAtMost reads root's file rel, failing if it holds more than max bytes.
func readAtMost(root *os.Root, rel string, max int64) ([]byte, error) {
	f, err := root.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s holds more than the %d bytes a kept file may have", rel, max)
	}
	return b, nil
}

// mkdirLikeIn makes the missing directories of rel inside root with the mode and owner they have
// in lower (0755 root when lower has none).
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
		if lower != "" {
			if st, err := os.Stat(filepath.Join(lower, cur)); err == nil && st.IsDir() {
				mode = st.Mode().Perm() | st.Mode()&os.ModeSticky
				if s, ok := st.Sys().(*syscall.Stat_t); ok {
					uid, gid = int(s.Uid), int(s.Gid)
				}
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

// syncTree flushes the filesystem holding dir (the restored layer, before it replaces the old
// one), best effort.
func syncTree(dir string) {
	if d, err := os.Open(dir); err == nil {
		unix.Syncfs(int(d.Fd()))
		d.Close()
	}
}

// syncDir fsyncs a directory (a rename in it), best effort.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
