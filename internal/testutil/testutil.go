// Package testutil holds the few helpers every test package shares: gates for tests that need root,
// a binary or a Debian package (skip loudly outside CI, fail under CI=true), a slog logger that
// writes to t.Log, polling with a deadline instead of sleeps, an authenticated GET (HTTPGet), and
// binaries built from this tree (BuildBinary, cache.go) in a cache that never leaves anything in
// the system temp directory.
package testutil

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// InCI reports whether the tests run under CI (CI=true), where every gated test must run.
func InCI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1"
}

// Unavailable skips the test with a loud message, or fails it under CI=true.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("REQUIRED UNDER CI=true: "+format, args...)
	}
	t.Skipf("SKIPPED (not CI): "+format+" -- run scripts/setup.sh as root to get it", args...)
}

// RequireRoot gates a test on running as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "test needs root")
	}
}

// RequireBinary gates a test on a program being on PATH and returns its path.
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "test needs %q on PATH", name)
	}
	return p
}

// Logger returns a slog.Logger that writes through t.Log, so output shows only for failing tests
// (or with -v).
// Lines logged after the test's cleanups ran are dropped: a goroutine (a connection closing)
// may outlive its test by a moment, and t.Log then races with the test's end (the race
// detector reports it, failing the package) or panics.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(newTWriter(t), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newTWriter returns a writer to t.Log that drops what comes after the cleanups registered
// after it ran (cleanups run last registered first). For a fuzz test (*testing.F) it keeps the
// lines and logs them at its end if it failed: F.Log from another goroutine while F.Fuzz runs
// races with the testing package's own state.
func newTWriter(t testing.TB) *tWriter {
	w := &tWriter{t: t}
	if _, ok := t.(*testing.F); ok {
		w.held = new(strings.Builder)
	}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		held := w.held
		w.mu.Unlock()
		if held != nil && t.Failed() {
			t.Log(held.String())
		}
	})
	return w
}

type tWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool             // the test's cleanups ran: t.Log may no longer be called
	held *strings.Builder // a fuzz test's lines, logged at its end if it failed
}

func (w *tWriter) Write(p []byte) (n int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer func() { recover() }() // t.Log panics after the test; done should keep it from that
	switch {
	case w.done:
	case w.held != nil:
		w.held.Write(p)
	default:
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// Eventually polls cond every tick until it returns true or the timeout passes, then fails the test
// with msg.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("after %s: "+format, append([]any{timeout}, args...)...)
		case <-tick.C:
		}
	}
}

// ModuleRoot returns the directory holding go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found")
		}
		dir = parent
	}
}

// ModuleFile returns the content of the file at path rel from the module's root (testdata
// that tests of several packages share).
func ModuleFile(t testing.TB, rel string) string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// StartProcess starts a process whose output goes to the test log, and kills it (by pid) when
// the test ends.
func StartProcess(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	w := newTWriter(t)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		<-done
	})
	return cmd
}

// Deps returns the import paths that `go list -deps` prints for pkgs (patterns relative to the
// module root), for the tests that keep one part of the module from linking another.
func Deps(t testing.TB, pkgs ...string) []string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", strings.Join(pkgs, " "), err)
	}
	return strings.Fields(string(out))
}

// HTTPGet GETs url with "Authorization: Bearer <bearer>" (none if "") and returns the status
// code and the body; a request that fails fails the test.
func HTTPGet(t testing.TB, url, bearer string) (int, string) {
	t.Helper()
	return HTTPDo(t, http.MethodGet, url, bearer, "")
}

// HTTPDo sends a method request with body (none if "") to url, with "Authorization: Bearer
// <bearer>" (none if ""), and returns the status code and the body; a request that fails fails
// the test.
func HTTPDo(t testing.TB, method, url, bearer, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
