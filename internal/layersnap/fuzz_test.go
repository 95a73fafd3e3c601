package layersnap_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kloud-dev/kloud/internal/layersnap"
	"github.com/kloud-dev/kloud/internal/testutil"
)

// FuzzRestore restores hostile snapshot streams: data is a tar stream that the test compresses
// (rawZstd false: the fuzzer explores tar headers) or the whole zstd stream (rawZstd true: the
// fuzzer explores zstd frames). Whatever the stream, Restore must not write outside the layer's
// directory (a sibling directory and the layer's parent are unchanged, nothing is left beside
// the layer), must leave the layer as it was when it fails, and must not allocate more than
// maxAlloc however large a window or size the stream declares.
func FuzzRestore(f *testing.F) {
	testutil.RequireRoot(f)
	tarOf := func(hs ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"KLOUD.format": layersnap.Format}})
		for _, h := range hs {
			if h.Mode == 0 {
				h.Mode = 0o755
			}
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg && h.Size > 0 { // a huge Size gets 64 bytes: cut short
				tw.Write(bytes.Repeat([]byte("x"), int(min(h.Size, 64))))
			}
		}
		tw.Close()
		return b.Bytes()
	}
	root := &tar.Header{Name: "./", Typeflag: tar.TypeDir}
	for _, seed := range [][]byte{
		tarOf(root),
		tarOf(root, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 10}),
		tarOf(root, &tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1}),
		tarOf(root, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../outside"}, &tar.Header{Name: "l/f", Typeflag: tar.TypeReg, Size: 1}),
		tarOf(root, &tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside/keep"}),
		tarOf(root, &tar.Header{Name: "d", Typeflag: tar.TypeDir}, &tar.Header{Name: "d/c", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}),
		tarOf(root, &tar.Header{Name: "s", Typeflag: tar.TypeReg, Size: 1 << 40}),
	} {
		f.Add(seed, false)
		var z bytes.Buffer
		zw, _ := zstd.NewWriter(&z)
		zw.Write(seed)
		zw.Close()
		f.Add(z.Bytes(), true)
	}
	// A zstd frame declaring the largest window (512 MiB) with one raw block of a tar header's
	// first bytes: a decoder that trusts the window allocates twice that.
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x98, 0x09, 0x00, 0x00, 'x'}, true)
	f.Fuzz(func(t *testing.T, data []byte, rawZstd bool) {
		watchdog := time.AfterFunc(20*time.Second, func() { // an input that hangs is a finding: its stacks
			buf := make([]byte, 1<<20)
			panic("FuzzRestore input ran 20 s:\n" + string(buf[:runtime.Stack(buf, true)]))
		})
		defer watchdog.Stop()
		stream := data
		if !rawZstd {
			var z bytes.Buffer
			zw, _ := zstd.NewWriter(&z)
			zw.Write(data)
			zw.Close()
			stream = z.Bytes()
		}
		dir := t.TempDir()
		outside := filepath.Join(dir, "outside")
		upper := filepath.Join(dir, "layer", "upper")
		for _, d := range []string{outside, upper} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{filepath.Join(outside, "keep"), filepath.Join(upper, "old")} {
			if err := os.WriteFile(p, []byte("before"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		before, outsideBefore := tree(t, dir), tree(t, outside)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second) // a small stream may expand to GBs: what Restore writes in 3 s
		defer cancel()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		err := layersnap.Restore(ctx, bytes.NewReader(stream), upper, layersnap.RestoreOptions{})
		runtime.ReadMemStats(&m1)
		if n := m1.TotalAlloc - m0.TotalAlloc; n > maxAlloc {
			t.Errorf("Restore of a %d-byte stream allocated %d MiB (more than %d MiB)", len(stream), n>>20, maxAlloc>>20)
		}
		if got := tree(t, outside); got != outsideBefore {
			t.Errorf("outside the layer changed:\nbefore:\n%s\nafter:\n%s", outsideBefore, got)
		}
		ents, _ := os.ReadDir(filepath.Dir(upper))
		if len(ents) != 1 {
			t.Errorf("Restore (err %v) left %d entries beside the layer: %v", err, len(ents), ents)
		}
		top, _ := os.ReadDir(dir)
		if len(top) != 2 {
			t.Errorf("Restore (err %v) wrote into the layer's grandparent: %v", err, top)
		}
		if err != nil {
			if after := tree(t, dir); after != before {
				t.Errorf("a failed Restore (%v) changed the tree:\nbefore:\n%s\nafter:\n%s", err, before, after)
			}
		}
	})
}

// maxAlloc bounds what one Restore may allocate: its buffers and a zstd window (at most
// layersnap's decoder limit, 16 MiB, twice), not what the stream declares.
const maxAlloc = 96 << 20

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// TestRestoreCancelledStopsInsideAnEntry: a stream whose one entry declares 1 GiB (8192 zstd RLE
// blocks of 'x': 32 KiB of stream) is not written out once ctx has ended; Restore stops at the
// next chunk, having read a small part of the stream, and the layer is unchanged.
func TestRestoreCancelledStopsInsideAnEntry(t *testing.T) {
	testutil.RequireRoot(t)
	const blocks, blockLen = 8192, 128 << 10
	var head bytes.Buffer
	tw := tar.NewWriter(&head)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"KLOUD.format": layersnap.Format}})
	tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: blocks * blockLen})
	tw.Flush()
	var stream bytes.Buffer
	zw, _ := zstd.NewWriter(&stream)
	zw.Write(head.Bytes())
	zw.Close()
	stream.Write([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x50}) // a frame with a 1 MiB window
	for i := range blocks {
		h := uint32(blockLen)<<3 | 1<<1 // RLE
		if i == blocks-1 {
			h |= 1 // last
		}
		stream.Write([]byte{byte(h), byte(h >> 8), byte(h >> 16), 'x'})
	}
	upper := filepath.Join(t.TempDir(), "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	total := int64(stream.Len())
	cr := &countReader{r: &stream}
	err := layersnap.Restore(ctx, cr, upper, layersnap.RestoreOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Restore with a cancelled ctx: %v", err)
	}
	t.Logf("read %d of the stream's %d bytes", cr.n, total)
	if cr.n > total/2 {
		t.Errorf("a cancelled Restore read %d of the stream's %d bytes: it wrote the entry out", cr.n, total)
	}
	if ents, _ := os.ReadDir(upper); len(ents) != 0 {
		t.Errorf("the layer changed: %v", ents)
	}
}
