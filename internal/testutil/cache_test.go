package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BuildBinary leaves nothing in the system temp directory (go build's own work dir included,
// which follows TMPDIR), puts the binary into the cache, and a later test process (a fresh memo)
// gets the same file back.
func TestBuildBinaryUsesTheCacheNotTemp(t *testing.T) {
	cache := t.TempDir()
	tmp := t.TempDir()
	t.Setenv("KLOUD_CACHE", cache)
	t.Setenv("TMPDIR", tmp)
	resetMemo(t)

	const pkg = "./internal/testutil/testdata/hello"
	p := BuildBinary(t, pkg)
	if !strings.HasPrefix(p, filepath.Join(cache, testbinName)+"/") || filepath.Base(p) != "hello" {
		t.Fatalf("binary at %s, want hello under %s/%s", p, cache, testbinName)
	}
	out, err := exec.Command(p).Output()
	if err != nil || !strings.Contains(string(out), "hello from a cached test binary") {
		t.Fatalf("run %s: %v: %s", p, err, out)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("BuildBinary left %v in TMPDIR", left)
	}
	staged, err := filepath.Glob(filepath.Join(cache, testbinName, stageName, "hello-*", "hello"))
	if err != nil || len(staged) != 1 {
		t.Fatalf("stage: %v %v, want one hello", staged, err)
	}
	before, err := os.Stat(staged[0])
	if err != nil {
		t.Fatal(err)
	}
	resetMemo(t)
	if p2 := BuildBinary(t, pkg); p2 != p {
		t.Fatalf("second build at %s, want the cached %s", p2, p)
	}
	// Nothing changed: go build found its last build in the stage and did not link it again
	// (a new link is moved into place: another file; go only touches an up-to-date one).
	if after, err := os.Stat(staged[0]); err != nil || !os.SameFile(before, after) {
		t.Fatalf("the staged binary was replaced (%v), want it left in place", err)
	}
	entries, _ := os.ReadDir(filepath.Join(cache, testbinName))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 2 || names[0] != stageName || !strings.HasPrefix(names[1], "hello-") {
		t.Fatalf("cache holds %v, want the stage and one entry (no half-written ones)", names)
	}
}

func TestPruneBinaries(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	for n, age := range map[string]time.Duration{
		"klient-old": binMaxAge + time.Hour, // unused for too long
		"klient-a":   2 * time.Hour,
		"klient-b":   3 * time.Hour,
		"klient-c":   4 * time.Hour,
		"klient-d":   5 * time.Hour,
		"klient-e":   6 * time.Hour, // the fifth most recent: over keepPerName
		"kloud-x":    7 * time.Hour, // another binary: its own count
		".tmp-123":   2 * tmpMaxAge, // a build that died
		".tmp-456":   time.Minute,   // a build going on
	} {
		p := filepath.Join(dir, n)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, now.Add(-age), now.Add(-age))
	}
	pruneBinaries(dir, now)
	var got []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if want := ".tmp-456,klient-a,klient-b,klient-c,klient-d,kloud-x"; strings.Join(got, ",") != want {
		t.Fatalf("after prune: %v, want %s", got, want)
	}
}

// RunDir makes a directory outside the system temp dir; its remove func removes it, and a
// directory of a process that has exited is swept by the next RunDir.
func TestRunDir(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("KLOUD_CACHE", cache)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(cache, testrunName, "e2e-"+itoa(dead.Process.Pid)+"-123")
	if err := os.MkdirAll(filepath.Join(stale, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir, remove, err := RunDir("e2e")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dir, filepath.Join(cache, testrunName)+"/e2e-"+itoa(os.Getpid())+"-") {
		t.Fatalf("run dir %s", dir)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the dead process's run dir is still there: %v", err)
	}
	remove()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("run dir not removed: %v", err)
	}
}

func resetMemo(t *testing.T) {
	buildMu.Lock()
	saved := buildCache
	buildCache = map[string]string{}
	buildMu.Unlock()
	t.Cleanup(func() {
		buildMu.Lock()
		buildCache = saved
		buildMu.Unlock()
	})
}

func itoa(i int) string { return strconv.Itoa(i) }
