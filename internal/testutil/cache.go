package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/filehash"
)

// Test binaries and run directories live in the project's cache, never in the system temp
// directory: a test binary has no hook that runs when it exits (a timeout panics, a package
// without TestMain has none at all), so anything it put into /tmp stayed there.
//
//   - BuildBinary keeps binaries content-addressed in CacheDir()/testbin/<name>-<sha256>/<name>:
//     every test process builds its binary into the package's stage (testbin/.stage/, where go
//     build finds its last build and does not link again if nothing changed) and hashes it; an
//     identical binary is reused, a new one is added. The next test process that builds
//     something removes entries (and stages) not used for binMaxAge and all but the keepPerName
//     most recently used of each binary.
//   - RunDir gives a TestMain a directory of its own, CacheDir()/testrun/<name>-<pid>-<random>,
//     which it removes when its tests are done; one whose process has died (a timeout, a kill) is
//     removed by the next RunDir.
const (
	binMaxAge   = 72 * time.Hour
	keepPerName = 4
	tmpMaxAge   = time.Hour // a half-written cache entry (".tmp-*") of a process that died
	testbinName = "testbin"
	stageName   = ".stage" // under testbin: buildStaged's last builds
	testrunName = "testrun"
)

// CacheDir is where tests keep what outlives one test: $KLOUD_CACHE (the Makefile's and
// scripts' cache, default /var/cache/kloud) if it is writable, else the user's cache directory
// (os.UserCacheDir()/kloud), for a developer who runs go test without root.
func CacheDir() (string, error) {
	c := os.Getenv("KLOUD_CACHE")
	if c == "" {
		c = "/var/cache/kloud"
	}
	if err := writableDir(c); err == nil {
		return c, nil
	}
	u, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no writable cache directory (%s is not, and %w)", c, err)
	}
	u = filepath.Join(u, "kloud")
	if err := writableDir(u); err != nil {
		return "", fmt.Errorf("no writable cache directory: %s nor %s: %w", c, u, err)
	}
	return u, nil
}

func writableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return syscall.Access(dir, 2 /* W_OK */)
}

// BuildTags are the build tags of the binaries: the Makefile's TAGS, which must be the same (a test
// in e2e compares them). ferretdb_no_postgresql leaves FerretDB's PostgreSQL backend and pgx out
// of kloud: the embedded store uses its SQLite backend only (kloud/store/embedded.go).
const BuildTags = "ferretdb_no_postgresql"

var (
	buildMu    sync.Mutex
	buildCache = map[string]string{}
	pruneOnce  sync.Once
)

// BuildBinary builds the main package pkg (e.g. "./cmd/klient", relative to the module root)
// once per test process and returns the path of the binary, which is named like pkg's last
// element and lives in the content-addressed cache described above (never in the system temp
// directory). Callers must not write next to it.
func BuildBinary(t testing.TB, pkg string) string {
	t.Helper()
	p, err := CachedBinary(pkg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// CachedBinary is BuildBinary for code without a testing.TB (a TestMain).
func CachedBinary(pkg string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := buildCache[pkg]; ok {
		return p, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, testbinName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("test binary cache: %w", err)
	}
	pruneOnce.Do(func() { pruneBinaries(dir, time.Now()) })
	name := filepath.Base(pkg)
	final, err := buildStaged(root, dir, pkg, name)
	if err != nil {
		return "", err
	}
	now := time.Now()
	os.Chtimes(final, now, now) // in use: not pruned
	p := filepath.Join(final, name)
	buildCache[pkg] = p
	return p, nil
}

// buildStaged builds pkg into its stage, <dir>/.stage/<name>-<hash of root and pkg>/<name>,
// where go build finds the binary of its last build and, if nothing changed, does not link it
// again (linking kloud costs 2 s of CPU; the suite's test processes asked for binaries some 50
// times a run). It then copies the binary, unless it is there, into its content-addressed
// entry <dir>/<name>-<sha256> and returns that entry. A lock on the stage keeps test processes
// that build the same package from writing it at once.
func buildStaged(root, dir, pkg, name string) (string, error) {
	key := sha256.Sum256([]byte(root + "\x00" + pkg + "\x00" + BuildTags))
	stage := filepath.Join(dir, stageName, name+"-"+hex.EncodeToString(key[:6]))
	if err := os.MkdirAll(stage, 0o755); err != nil {
		return "", fmt.Errorf("test binary cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(stage, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("test binary cache: %w", err)
	}
	defer lock.Close() // and with it the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("test binary cache: lock %s: %w", stage, err)
	}
	now := time.Now()
	os.Chtimes(stage, now, now) // in use: not pruned
	bin := filepath.Join(stage, name)
	// Without VCS stamping, unchanged sources give the same binary after a commit elsewhere.
	cmd := exec.Command("go", "build", "-buildvcs=false", "-tags", BuildTags, "-o", bin, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	sum, err := filehash.SHA256(bin)
	if err != nil {
		return "", fmt.Errorf("test binary cache: %w", err)
	}
	final := filepath.Join(dir, name+"-"+sum[:24])
	if _, err := os.Stat(filepath.Join(final, name)); err == nil {
		return final, nil
	}
	tmp, err := os.MkdirTemp(dir, ".tmp-")
	if err != nil {
		return "", fmt.Errorf("test binary cache: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename; removes a failed copy
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("test binary cache: %w", err)
	}
	if err := copyFile(bin, filepath.Join(tmp, name)); err != nil {
		return "", fmt.Errorf("test binary cache: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		// Another test process put the same binary there first: use it.
		if _, serr := os.Stat(filepath.Join(final, name)); serr != nil {
			return "", fmt.Errorf("test binary cache: %w", err)
		}
	}
	return final, nil
}

// copyFile copies the executable src to the new file dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// pruneBinaries removes cache entries not used for binMaxAge, all but the keepPerName most
// recently used of each binary (unless used within the last hour: a test process may run it),
// and half-written ones older than tmpMaxAge. Errors are ignored: pruning is housekeeping.
func pruneBinaries(dir string, now time.Time) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type entry struct {
		name string
		age  time.Duration
	}
	byBinary := map[string][]entry{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		age := now.Sub(fi.ModTime())
		if strings.HasPrefix(e.Name(), ".tmp-") {
			if age > tmpMaxAge {
				os.RemoveAll(filepath.Join(dir, e.Name()))
			}
			continue
		}
		i := strings.LastIndexByte(e.Name(), '-')
		if i <= 0 {
			continue
		}
		byBinary[e.Name()[:i]] = append(byBinary[e.Name()[:i]], entry{e.Name(), age})
	}
	if stages, err := os.ReadDir(filepath.Join(dir, stageName)); err == nil {
		for _, e := range stages {
			if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > binMaxAge {
				os.RemoveAll(filepath.Join(dir, stageName, e.Name()))
			}
		}
	}
	for _, es := range byBinary {
		sort.Slice(es, func(i, j int) bool { return es[i].age < es[j].age })
		for i, e := range es {
			if e.age > binMaxAge || (i >= keepPerName && e.age > tmpMaxAge) {
				os.RemoveAll(filepath.Join(dir, e.name))
			}
		}
	}
}

// RunDir returns a new directory for one test process (for a TestMain: t.TempDir is for tests),
// CacheDir()/testrun/<name>-<pid>-<random>, and a function that removes it; call that when the
// tests are done. Directories of processes that no longer run are removed first, so a test
// binary killed before its cleanup leaves nothing for long, and nothing in the system temp
// directory.
func RunDir(name string) (dir string, remove func(), err error) {
	cache, err := CacheDir()
	if err != nil {
		return "", nil, err
	}
	parent := filepath.Join(cache, testrunName)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", nil, fmt.Errorf("test run directory: %w", err)
	}
	sweepRunDirs(parent)
	dir, err = os.MkdirTemp(parent, name+"-"+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", nil, fmt.Errorf("test run directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("test run directory: %w", err)
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// sweepRunDirs removes run directories whose process is gone.
func sweepRunDirs(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		parts := strings.Split(e.Name(), "-")
		if len(parts) < 3 {
			continue
		}
		pid, err := strconv.Atoi(parts[len(parts)-2])
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
}
