package layersnap_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/internal/atomicfile"
	"github.com/kloud-dev/kloud/internal/layersnap"
	"github.com/kloud-dev/kloud/internal/testutil"
)

// makeLayer fills dir with what an overlay upper dir holds.
func makeLayer(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	w := func(rel, content string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, rel)
		must(os.MkdirAll(filepath.Dir(p), 0o755))
		must(os.WriteFile(p, []byte(content), mode))
		must(os.Chmod(p, mode))
	}
	w("root/keep.txt", "v1\n", 0o644)
	w("etc/machine-id", "snapshotted-machine\n", 0o444)
	w("usr/bin/suid", "#!/bin/true\n", 0o755)
	must(os.Chmod(filepath.Join(dir, "usr/bin/suid"), 0o4755|os.ModeSetuid))
	must(unix.Chmod(filepath.Join(dir, "usr/bin/suid"), 0o4755))
	w("home/alice/notes", strings.Repeat("alice ", 10000), 0o600)
	must(os.Lchown(filepath.Join(dir, "home/alice/notes"), 1000, 1000))
	must(os.Lchown(filepath.Join(dir, "home/alice"), 1000, 1000))
	must(os.Link(filepath.Join(dir, "root/keep.txt"), filepath.Join(dir, "root/hard")))
	must(os.Symlink("keep.txt", filepath.Join(dir, "root/link")))
	must(os.Symlink("/etc/passwd", filepath.Join(dir, "root/abs-link")))
	must(unix.Mknod(filepath.Join(dir, "etc/issue"), unix.S_IFCHR|0o000, 0)) // a whiteout
	must(unix.Mknod(filepath.Join(dir, "root/fifo"), unix.S_IFIFO|0o640, 0))
	must(os.MkdirAll(filepath.Join(dir, "usr/share/doc/bash"), 0o755))
	must(unix.Setxattr(filepath.Join(dir, "usr/share/doc/bash"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Setxattr(filepath.Join(dir, "root/keep.txt"), "user.note", []byte("kept"), 0))
	must(os.Mkdir(filepath.Join(dir, "tmp"), 0o1777))
	must(unix.Chmod(filepath.Join(dir, "tmp"), 0o1777))
	w("empty", "", 0o600)
	// Sparse: 48 MiB long, two small runs of data (a hole at the end too).
	sp, err := os.Create(filepath.Join(dir, "root/sparse"))
	must(err)
	_, err = sp.WriteAt([]byte("start"), 0)
	must(err)
	_, err = sp.WriteAt([]byte("middle"), 20<<20)
	must(err)
	must(sp.Truncate(48 << 20))
	must(sp.Close())
}

// tree describes every entry under dir (type, mode, owner, size, content hash, link target,
// device, xattrs, link count; mtimes of all but directories), skipping rels in skip.
func tree(t *testing.T, dir string, skip ...string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		for _, s := range skip {
			if rel == s {
				return nil
			}
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %o %d:%d n%d", rel, st.Mode, st.Uid, st.Gid, st.Nlink)
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %x", sha256.Sum256(b))
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice) != 0:
			line += fmt.Sprintf(" dev %d", st.Rdev)
		}
		if !fi.IsDir() {
			line += " " + fi.ModTime().UTC().String()
		}
		buf := make([]byte, 4096)
		if n, err := unix.Llistxattr(p, buf); err == nil {
			names := strings.Split(strings.Trim(string(buf[:n]), "\x00"), "\x00")
			sort.Strings(names)
			for _, x := range names {
				if x == "" {
					continue
				}
				v := make([]byte, 256)
				vn, _ := unix.Lgetxattr(p, x, v)
				line += fmt.Sprintf(" %s=%q", x, v[:max(vn, 0)])
			}
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

func save(t *testing.T, dir string, meta map[string]string) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	if _, err := layersnap.Save(t.Context(), dir, &b, layersnap.SaveOptions{Meta: meta}); err != nil {
		t.Fatal(err)
	}
	return &b
}

// A layer saved and restored into another layer is the same tree (owners, modes incl. setuid and
// sticky, hard and symbolic links, whiteouts, fifos, xattrs incl. trusted.overlay.*, times),
// except the target's KeepPaths, which keep its own content; the target's work dir is emptied
// and nothing is left beside the upper dir.
func TestSaveRestore(t *testing.T) {
	testutil.RequireRoot(t)
	src := filepath.Join(t.TempDir(), "upper")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	makeLayer(t, src)
	if err := unix.Mknod(filepath.Join(src, "sock"), unix.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	info, err := layersnap.Save(t.Context(), src, &b, layersnap.SaveOptions{Meta: map[string]string{"baseImage": "/images/a", "machine": "m1"}})
	if err != nil {
		t.Fatal(err)
	}
	if info.Files < 15 || info.DiskSize < 60000 {
		t.Fatalf("info %+v", info)
	}
	if meta, err := layersnap.ReadMeta(bytes.NewReader(b.Bytes())); err != nil || meta["baseImage"] != "/images/a" || meta["machine"] != "m1" || len(meta) != 2 {
		t.Fatalf("ReadMeta: %v %v", meta, err)
	}
	os.Remove(filepath.Join(src, "sock"))

	parent := t.TempDir()
	dst := filepath.Join(parent, "upper")
	work := filepath.Join(parent, "work")
	for _, d := range []string{dst, filepath.Join(dst, "etc"), filepath.Join(work, "work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dst, "etc/machine-id"), []byte("target\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	os.Lchown(filepath.Join(dst, "etc/machine-id"), 7, 8)
	if err := os.WriteFile(filepath.Join(dst, "later"), []byte("written after"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An interrupted restore's leftovers.
	if err := os.MkdirAll(filepath.Join(parent, "upper.restore-0123"), 0o700); err != nil {
		t.Fatal(err)
	}
	lower := t.TempDir()
	os.MkdirAll(filepath.Join(lower, "var/lib/cloud"), 0o750)
	os.Chmod(filepath.Join(lower, "var/lib/cloud"), 0o750)
	os.WriteFile(filepath.Join(dst, "seed"), []byte("target seed"), 0o600)
	if err := os.MkdirAll(filepath.Join(dst, "var/lib/cloud/seed"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "var/lib/cloud/seed/meta-data"), []byte("instance-id: target"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = layersnap.Restore(t.Context(), bytes.NewReader(b.Bytes()), dst, layersnap.RestoreOptions{
		Match:     map[string]string{"baseImage": "/images/a"},
		KeepPaths: []string{"etc/machine-id", "var/lib/cloud/seed/meta-data", "etc/kloud/kite.key"},
		LowerDir:  lower,
		WorkDir:   work,
	})
	if err != nil {
		t.Fatal(err)
	}
	// "." differs in its link count only (the target's var/ was kept).
	skip := []string{".", "etc/machine-id", "var", "var/lib", "var/lib/cloud", "var/lib/cloud/seed", "var/lib/cloud/seed/meta-data"}
	if got, want := tree(t, dst, skip...), tree(t, src, skip...); got != want {
		t.Errorf("restored tree:\n%s\nwant\n%s", got, want)
	}
	if st, err := os.Stat(filepath.Join(dst, "root/sparse")); err != nil || st.Size() != 48<<20 || st.Sys().(*syscall.Stat_t).Blocks*512 > 1<<20 {
		t.Errorf("the sparse file restored: %v %v (%d bytes allocated)", st, err, st.Sys().(*syscall.Stat_t).Blocks*512)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "etc/machine-id")); err != nil || string(b) != "target\n" {
		t.Errorf("kept machine-id: %q %v", b, err)
	}
	if st, err := os.Lstat(filepath.Join(dst, "etc/machine-id")); err != nil || st.Mode().Perm() != 0o400 || st.Sys().(*syscall.Stat_t).Uid != 7 {
		t.Errorf("kept machine-id's mode/owner: %v %v", st, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "var/lib/cloud/seed/meta-data")); err != nil || string(b) != "instance-id: target" {
		t.Errorf("kept seed: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(dst, "var/lib/cloud")); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("a kept file's parent is made like the lower's: %v %v", st, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "etc/kloud")); err == nil {
		t.Errorf("a keep path the target lacks made its directory")
	}
	if ents, _ := os.ReadDir(work); len(ents) != 0 {
		t.Errorf("work dir not emptied: %v", ents)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 2 {
		t.Errorf("beside the upper dir: %v", ents)
	}
}

// hostile builds a stream of entries hs (mode 0755) with the given metadata.
func hostile(t *testing.T, meta map[string]string, hs ...*tar.Header) *bytes.Buffer {
	t.Helper()
	recs := map[string]string{"KLOUD.format": layersnap.Format}
	for k, v := range meta {
		recs["KLOUD."+k] = v
	}
	var b bytes.Buffer
	zw, _ := zstd.NewWriter(&b)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: recs}); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		h.Mode = 0o755
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	zw.Close()
	return &b
}

// Restore refuses streams whose entries would land outside the new layer (through a path, a
// symlink an earlier entry made or a hard link), of another format or metadata, truncated or
// cancelled: each time the upper dir is as it was, nothing is left beside it and nothing was
// written outside.
func TestRestoreRefuses(t *testing.T) {
	testutil.RequireRoot(t)
	outside := t.TempDir()
	root := func() *tar.Header { return &tar.Header{Name: "./", Typeflag: tar.TypeDir} }
	good := hostile(t, map[string]string{"baseImage": "/base"}, root(), &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 100000})
	truncated := bytes.NewBuffer(good.Bytes()[:good.Len()/2])
	var notZstd bytes.Buffer
	notZstd.WriteString("plain text, not a snapshot")
	var noHeader bytes.Buffer
	zw, _ := zstd.NewWriter(&noHeader)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.Close()
	zw.Close()
	// Cut cleanly between two entries: archive/tar alone would take it for the end.
	var cut bytes.Buffer
	zw, _ = zstd.NewWriter(&cut)
	tw = tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"KLOUD.format": layersnap.Format, "KLOUD.baseImage": "/base"}})
	tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	tw.Write([]byte("abc"))
	tw.Flush()
	zw.Close()
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	base := map[string]string{"baseImage": "/base"}
	cases := map[string]struct {
		r   io.Reader
		ctx context.Context
	}{
		"dotdot":         {r: hostile(t, base, root(), &tar.Header{Name: "../x", Typeflag: tar.TypeDir})},
		"absolute":       {r: hostile(t, base, root(), &tar.Header{Name: "/x", Typeflag: tar.TypeDir})},
		"under symlink":  {r: hostile(t, base, root(), &tar.Header{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: outside}, &tar.Header{Name: "etc/x", Typeflag: tar.TypeReg, Size: 3})},
		"over symlink":   {r: hostile(t, base, root(), &tar.Header{Name: "x", Typeflag: tar.TypeSymlink, Linkname: filepath.Join(outside, "x")}, &tar.Header{Name: "x", Typeflag: tar.TypeReg, Size: 3})},
		"hard link out":  {r: hostile(t, base, root(), &tar.Header{Name: "x", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"})},
		"hard link abs":  {r: hostile(t, base, root(), &tar.Header{Name: "x", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"})},
		"no parent":      {r: hostile(t, base, root(), &tar.Header{Name: "a/b", Typeflag: tar.TypeDir})},
		"root a symlink": {r: hostile(t, base, &tar.Header{Name: ".", Typeflag: tar.TypeSymlink, Linkname: outside})},
		"other base":     {r: hostile(t, map[string]string{"baseImage": "/other"}, root())},
		"no metadata":    {r: hostile(t, nil, root())},
		"no header":      {r: &noHeader},
		"not zstd":       {r: &notZstd},
		"truncated":      {r: truncated},
		"cut between":    {r: &cut},
		"cancelled":      {r: bytes.NewReader(good.Bytes()), ctx: cancelled},
	}
	parent := t.TempDir()
	upper := filepath.Join(parent, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	makeLayer(t, upper)
	before := tree(t, upper)
	for name, c := range cases {
		ctx := c.ctx
		if ctx == nil {
			ctx = t.Context()
		}
		err := layersnap.Restore(ctx, c.r, upper, layersnap.RestoreOptions{Match: base, KeepPaths: []string{"etc/machine-id"}})
		if err == nil {
			t.Errorf("%s: restored", name)
			continue
		}
		t.Logf("%s: %v", name, err)
		if strings.HasSuffix(name, "base") || name == "no metadata" {
			if !errors.Is(err, layersnap.ErrMismatch) {
				t.Errorf("%s: %v, want ErrMismatch", name, err)
			}
		}
		if got := tree(t, upper); got != before {
			t.Fatalf("%s: the upper dir changed:\n%s", name, got)
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 1 {
			t.Fatalf("%s: left beside the upper dir: %v", name, ents)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("something was written outside: %v", ents)
	}
	if err := layersnap.Restore(t.Context(), bytes.NewReader(good.Bytes()), upper, layersnap.RestoreOptions{Match: base, KeepPaths: []string{"../escape"}}); err == nil {
		t.Fatal("a keep path outside the layer was accepted")
	}
	abort := errors.New("started meanwhile")
	err := layersnap.Restore(t.Context(), bytes.NewReader(good.Bytes()), upper, layersnap.RestoreOptions{Match: base, BeforeSwap: func() error { return abort }})
	if !errors.Is(err, abort) || tree(t, upper) != before {
		t.Fatalf("BeforeSwap's error: %v (or the upper dir changed)", err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		t.Fatalf("BeforeSwap's error: left beside the upper dir: %v", ents)
	}
	called := false
	if err := layersnap.Restore(t.Context(), bytes.NewReader(good.Bytes()), upper, layersnap.RestoreOptions{Match: base, BeforeSwap: func() error { called = true; return nil }}); err != nil || !called {
		t.Fatalf("the good stream: %v (BeforeSwap called: %v)", err, called)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "f")); err != nil || len(b) != 100000 {
		t.Fatalf("the good stream's file: %d %v", len(b), err)
	}
	if _, err := layersnap.Save(t.Context(), upper, io.Discard, layersnap.SaveOptions{Meta: map[string]string{"bad key": "x"}}); err == nil {
		t.Fatal("a metadata key with a space was accepted")
	}
}

// A symlink the layer's owner planted where a keep path is (or on its way) never makes Restore
// read or write outside the layers.
func TestRestoreKeepPathsThroughSymlinks(t *testing.T) {
	testutil.RequireRoot(t)
	src := filepath.Join(t.TempDir(), "upper")
	os.MkdirAll(filepath.Join(src, "etc/kloud"), 0o755)
	os.WriteFile(filepath.Join(src, "etc/kloud/kite.key"), []byte("snapshot's key"), 0o600)
	b := save(t, src, nil)

	host := t.TempDir()
	sentinel := filepath.Join(host, "kite.key")
	os.WriteFile(sentinel, []byte("host's"), 0o600)
	os.WriteFile(filepath.Join(host, "machine-id"), []byte("host's id"), 0o600)
	dst := filepath.Join(t.TempDir(), "upper")
	os.MkdirAll(dst, 0o755)
	os.Symlink(host, filepath.Join(dst, "etc")) // the target's /etc leads to the host
	err := layersnap.Restore(t.Context(), b, dst, layersnap.RestoreOptions{KeepPaths: []string{"etc/kloud/kite.key", "etc/machine-id"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(sentinel); string(got) != "host's" {
		t.Fatalf("host file behind the symlink: %q", got)
	}
	// The target's own key is behind a symlink out of its layer: it has none to keep, and the
	// snapshot's is not kept either.
	if got, err := os.ReadFile(filepath.Join(dst, "etc/kloud/kite.key")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("restored kite.key: %q %v", got, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "etc/machine-id")); err == nil {
		t.Fatal("the host's machine-id was copied into the layer")
	}

	// A kept file its owner made huge (sparse) fails the restore instead of filling kloud's
	// memory, the layer unchanged.
	os.Remove(filepath.Join(dst, "etc"))
	os.MkdirAll(filepath.Join(dst, "etc/kloud"), 0o755)
	huge := filepath.Join(dst, "etc/kloud/kite.key")
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 10<<30); err != nil {
		t.Fatal(err)
	}
	err = layersnap.Restore(t.Context(), save(t, src, nil), dst, layersnap.RestoreOptions{KeepPaths: []string{"etc/kloud/kite.key"}})
	if err == nil || !strings.Contains(err.Error(), "kite.key") {
		t.Fatalf("a 10 GiB kept file: %v", err)
	}
	t.Logf("huge kept file: %v", err)
	if st, err := os.Stat(huge); err != nil || st.Size() != 10<<30 {
		t.Fatalf("the layer changed: %v %v", st, err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(dst)); len(ents) != 1 {
		t.Fatalf("left beside the layer: %v", ents)
	}
}

// SaveFile writes the snapshot atomically (nothing left on error, BeforeCommit's included);
// RemoveFile removes it and what an interrupted SaveFile left.
func TestSaveFile(t *testing.T) {
	testutil.RequireRoot(t)
	src := filepath.Join(t.TempDir(), "upper")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	makeLayer(t, src)
	dir := filepath.Join(t.TempDir(), "snapshots")
	p := filepath.Join(dir, "s1.tar.zst")
	abort := errors.New("started meanwhile")
	if _, err := layersnap.SaveFile(t.Context(), src, p, layersnap.SaveOptions{BeforeCommit: func() error { return abort }}); !errors.Is(err, abort) {
		t.Fatalf("BeforeCommit's error: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left after BeforeCommit's error: %v", ents)
	}
	var partial bytes.Buffer
	if _, err := layersnap.Save(t.Context(), src, &partial, layersnap.SaveOptions{BeforeCommit: func() error { return abort }}); !errors.Is(err, abort) {
		t.Fatalf("Save with BeforeCommit's error: %v", err)
	}
	dst := filepath.Join(t.TempDir(), "upper")
	os.Mkdir(dst, 0o755)
	if err := layersnap.Restore(t.Context(), &partial, dst, layersnap.RestoreOptions{}); err == nil {
		t.Fatal("the stream of a Save that BeforeCommit failed was restored")
	}
	info, err := layersnap.SaveFile(t.Context(), src, p, layersnap.SaveOptions{Meta: map[string]string{"k": "v"}, BeforeCommit: func() error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Size() != info.Size || st.Mode().Perm() != 0o600 || info.Files < 15 {
		t.Fatalf("snapshot file %v %v, info %+v", st, err, info)
	}
	f, _ := os.Open(p)
	defer f.Close()
	if err := layersnap.Restore(t.Context(), f, dst, layersnap.RestoreOptions{Match: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	if got, want := tree(t, dst, "."), tree(t, src, "."); got != want {
		t.Errorf("restored from the file:\n%s\nwant\n%s", got, want)
	}
	// What an interrupted SaveFile leaves: its temporary file (internal/atomicfile names it).
	half, err := atomicfile.Create(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	half.Write([]byte("half"))
	half.Close()
	for range 2 {
		if err := layersnap.RemoveFile(p); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left after RemoveFile: %v", ents)
	}
}
