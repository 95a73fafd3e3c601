// Command snapshot measures local machine snapshots (providers/local: the sandbox library's
// SaveDisk and RestoreDisk, which the local provider's Snapshot and Restore call) against `tar`
// of the same directory, in the same run:
//
//   - snapshot: SaveDisk of a stopped machine whose disk (overlay upper dir) holds -size MiB
//     written into it (random bytes, incompressible: the worst case for the compressor), vs
//     `tar --xattrs --numeric-owner -cf` of that upper dir (the same owners, modes and extended
//     attributes the snapshot keeps; no compression).
//   - restore: RestoreDisk of that snapshot (unpack beside the upper dir, keep the machine's
//     identity files, atomic swap, remove the old disk) vs `tar -xpf` of the tar into a fresh
//     directory beside the upper dir, swapping the two (renameat2) and removing the old one.
//
// The save sides fsync their file (SaveDisk does; the tar side runs sync(1) on its output); the
// restore sides flush what they unpack before the swap (RestoreDisk: syncfs; the tar side: sync
// -f). They take turns, the first side alternating per round. The data is written from the
// host into the machine's upper dir while the machine is stopped: the same files on the same
// disk as a write inside the machine. It prints every round, the medians and the ratios; there is
// no target (issue 13 asks for the ratio). Needs root, the base image (sandbox.EnsureBaseImage),
// iproute2 and GNU tar; everything is made under -dir (default a new directory in /var/tmp) and
// removed at the end, also on an error or Ctrl-C.
//
//	set -a && . /var/cache/kloud/env && set +a && go run ./bench/snapshot [-size 1024] [-rounds 3]
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

func main() {
	sandbox.MaybeRunInit() // the machine's launcher and PID 1 are this binary
	size := flag.Int("size", 1024, "MiB written to the machine's disk")
	rounds := flag.Int("rounds", 3, "rounds (each: both sides of snapshot and restore)")
	dir := flag.String("dir", "", "work directory (default: a new directory in /var/tmp, removed at the end)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *size, *rounds, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "snapshot bench:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, sizeMiB, rounds int, dir string) (err error) {
	if err := sandbox.Available(); err != nil {
		return err
	}
	if _, err := exec.LookPath("tar"); err != nil {
		return err
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("/var/tmp", "kloud-bench-snapshot-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	base, err := sandbox.EnsureBaseImage(ctx, "", log)
	if err != nil {
		return fmt.Errorf("base image: %w", err)
	}
	suffix := make([]byte, 2)
	rand.Read(suffix)
	m, err := sandbox.New(sandbox.Options{
		StateDir: filepath.Join(dir, "machines"), BaseImage: base, Bridge: "kdbs" + hex.EncodeToString(suffix),
		Subnet: netip.MustParsePrefix(fmt.Sprintf("10.200.%d.0/24", 200+int(suffix[0])%50)), Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		m.GC(cctx, func(sandbox.Info) bool { return false })
		m.TeardownNetwork(cctx)
	}()
	const id = "bench-snap"
	in, err := m.Create(ctx, sandbox.Spec{ID: id, MemoryMB: 256})
	if err != nil {
		return fmt.Errorf("create machine: %w", err)
	}
	if _, err := m.Stop(ctx, id); err != nil {
		return err
	}
	upper := filepath.Join(in.Dir, "upper")
	if err := os.MkdirAll(filepath.Join(upper, "root"), 0o700); err != nil { // /root, as in the base image
		return err
	}
	if err := writeData(filepath.Join(upper, "root", "data"), int64(sizeMiB)<<20); err != nil {
		return err
	}
	exec.Command("sync").Run()
	fmt.Printf("machine %s stopped, %d MiB of random bytes in its disk (%s); %d rounds\n", id, sizeMiB, upper, rounds)

	load := func() string { b, _ := os.ReadFile("/proc/loadavg"); return string(b[:min(len(b), 14)]) }
	var snap, tarc, restore, tarx []time.Duration
	var snapSize, tarSize int64
	tarFile := filepath.Join(dir, "disk.tar")
	xattrs := []string{"--xattrs", "--xattrs-include=*", "--numeric-owner"}
	for r := range rounds {
		snapSide := func() error {
			t0 := time.Now()
			s, err := m.SaveDisk(ctx, id, "bench")
			if err != nil {
				return err
			}
			snap = append(snap, time.Since(t0))
			snapSize = s.Size
			t0 = time.Now()
			if err := m.RestoreDisk(ctx, id, "bench"); err != nil {
				return err
			}
			restore = append(restore, time.Since(t0))
			return nil
		}
		tarSide := func() error {
			t0 := time.Now()
			if err := sh(append(append([]string{"tar"}, xattrs...), "-C", upper, "-cf", tarFile, ".")...); err != nil {
				return err
			}
			if err := sh("sync", tarFile); err != nil {
				return err
			}
			tarc = append(tarc, time.Since(t0))
			st, _ := os.Stat(tarFile)
			tarSize = st.Size()
			// Restore's equivalent: unpack beside the disk, swap the two, remove the old one
			// (the content is the same: the machine's disk stays valid).
			x := filepath.Join(in.Dir, "tar-restore")
			t0 = time.Now()
			if err := os.Mkdir(x, 0o755); err != nil {
				return err
			}
			if err := sh(append(append([]string{"tar"}, xattrs...), "-C", x, "-xpf", tarFile)...); err != nil {
				return err
			}
			// RestoreDisk flushes the unpacked disk before the swap (syncfs): so does this side.
			if err := sh("sync", "-f", x); err != nil {
				return err
			}
			if err := unix.Renameat2(unix.AT_FDCWD, x, unix.AT_FDCWD, upper, unix.RENAME_EXCHANGE); err != nil {
				return err
			}
			if err := os.RemoveAll(x); err != nil {
				return err
			}
			tarx = append(tarx, time.Since(t0))
			return nil
		}
		first, second := snapSide, tarSide
		if r%2 == 1 {
			first, second = tarSide, snapSide
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
		fmt.Printf("round %d (load %s): snapshot %v, tar -c %v; restore %v, tar -x %v\n", r+1, load(),
			ms(snap[r]), ms(tarc[r]), ms(restore[r]), ms(tarx[r]))
		os.Remove(tarFile)
	}
	if err := m.DeleteSnapshot(ctx, "bench"); err != nil {
		return err
	}
	ms1, mt1, ms2, mt2 := median(snap), median(tarc), median(restore), median(tarx)
	fmt.Printf("\n%d MiB, medians of %d rounds (snapshot file %d MiB, tar %d MiB):\n", sizeMiB, rounds, snapSize>>20, tarSize>>20)
	fmt.Printf("| | kloud | tar | ratio |\n|---|---:|---:|---:|\n")
	fmt.Printf("| snapshot (save) | %v | %v | %.2f× |\n", ms(ms1), ms(mt1), float64(ms1)/float64(mt1))
	fmt.Printf("| restore | %v | %v | %.2f× |\n", ms(ms2), ms(mt2), float64(ms2)/float64(mt2))
	return nil
}

// writeData writes n random bytes to path (a fast PRNG: the bench measures the disk, not
// /dev/urandom).
func writeData(path string, n int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	var seed [32]byte
	rand.Read(seed[:])
	src := mrand.NewChaCha8(seed)
	buf := make([]byte, 1<<20)
	for w := int64(0); w < n; w += int64(len(buf)) {
		src.Read(buf)
		if _, err := f.Write(buf[:min(int64(len(buf)), n-w)]); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func sh(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %w: %s", argv, err, out)
	}
	return nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
