package sandbox

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// snapshotOf builds a snapshot stream of base image base with entries hs.
func snapshotOf(t *testing.T, base string, hs ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	zw, _ := zstd.NewWriter(&b)
	tw := tar.NewWriter(zw)
	all := append([]*tar.Header{{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{paxFormat: SnapshotFormat, paxBaseImage: base}}}, hs...)
	for _, h := range all {
		if h.Typeflag != tar.TypeXGlobalHeader {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	return &b
}

// extract refuses entries that would land outside the disk, through a path or a symlink made
// by an earlier entry, and snapshots of another base image.
func TestExtractRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	for name, hs := range map[string][]*tar.Header{
		"dotdot":        {{Name: "./", Typeflag: tar.TypeDir}, {Name: "../x", Typeflag: tar.TypeDir}},
		"absolute":      {{Name: "./", Typeflag: tar.TypeDir}, {Name: "/x", Typeflag: tar.TypeDir}},
		"under symlink": {{Name: "./", Typeflag: tar.TypeDir}, {Name: "etc", Typeflag: tar.TypeSymlink, Linkname: outside}, {Name: "etc/x", Typeflag: tar.TypeDir}},
		"hard link out": {{Name: "./", Typeflag: tar.TypeDir}, {Name: "x", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}},
		"no parent":     {{Name: "./", Typeflag: tar.TypeDir}, {Name: "a/b", Typeflag: tar.TypeDir}},
	} {
		dst := t.TempDir()
		err := extract(t.Context(), snapshotOf(t, "/base", hs...), dst, "/base")
		if err == nil {
			t.Errorf("%s: extracted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("something was written outside: %v", ents)
	}
	err := extract(t.Context(), snapshotOf(t, "/other", &tar.Header{Name: "./", Typeflag: tar.TypeDir}), t.TempDir(), "/base")
	if err == nil || !strings.Contains(err.Error(), "/other") {
		t.Fatalf("another base image: %v", err)
	}
	dst := t.TempDir()
	if err := extract(t.Context(), snapshotOf(t, "/base", &tar.Header{Name: "./", Typeflag: tar.TypeDir}, &tar.Header{Name: "d/", Typeflag: tar.TypeDir}), dst, "/base"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dst, "d")); err != nil || !st.IsDir() {
		t.Fatalf("a good snapshot: %v %v", st, err)
	}
}
