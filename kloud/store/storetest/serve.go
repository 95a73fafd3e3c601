package storetest

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// Served is a running `kloud store serve` (the real kloud binary) started by [Serve].
type Served struct {
	// URL is the mongodb:// URL of its unix socket with the options several kloud replicas of
	// one test share it with: maxPoolSize=8 (the server serialises commands per database, so a
	// pool is correct) and 60 s to select it on a loaded machine.
	URL string
	// Socket is the unix socket; DataDir its data directory.
	Socket, DataDir string

	cmd  *exec.Cmd
	done chan struct{}
}

// Serve starts `kloud store serve` with its data and socket in t.TempDir() and returns a URL
// that several kloud replicas (kloudtest.Start with Options.MongoURL and the same
// MongoDatabase) can share: unlike [Shared]'s and [NewServer]'s FerretDB, which are correct
// only with one connection in all, it executes its clients' commands one at a time per
// database. It is stopped (SIGTERM, then waited for) when the test ends, and dies with the test
// process (SIGTERM on the parent's death).
func Serve(t testing.TB) (mongoURL string) {
	t.Helper()
	return StartServe(t).URL
}

// StartServe is [Serve] returning the server, for a test that stops it ([Served.Stop]) or
// looks at its data directory.
func StartServe(t testing.TB) *Served {
	t.Helper()
	bin := testutil.BuildBinary(t, "./cmd/kloud")
	dir := t.TempDir()
	sock := filepath.Join(dir, "store.sock")
	if len(sock) > 100 { // a long test name: a short directory of our own, removed at the end
		short, err := os.MkdirTemp("", "kss")
		if err != nil {
			t.Fatalf("store serve: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(short) })
		sock = filepath.Join(short, "store.sock")
	}
	s := &Served{Socket: sock, DataDir: filepath.Join(dir, "data"), done: make(chan struct{})}
	s.cmd = exec.Command(bin, "store", "serve", "--data-dir", s.DataDir, "--socket", sock, "--log-level", "warn")
	s.cmd.Env = append(os.Environ(), "KLOUD_DATA_DIR=") // the flag wins; nothing inherited
	s.cmd.Stderr = logWriter{testutil.Logger(t)}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("store serve: %v", err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s store serve: %v", bin, err)
	}
	go func() {
		defer close(s.done)
		_ = s.cmd.Wait()
	}()
	t.Cleanup(s.Stop)
	line := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		l, _ := r.ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, r)
	}()
	var u string
	select {
	case u = <-line:
	case <-time.After(2 * time.Minute):
	case <-s.done:
	}
	if !strings.HasPrefix(u, "mongodb://") {
		t.Fatalf("kloud store serve did not print its URL (got %q)", u)
	}
	s.URL = u + "?maxPoolSize=8&serverSelectionTimeoutMS=60000&connectTimeoutMS=60000"
	return s
}

// Stop stops the server (SIGTERM: commands in flight finish) and waits for it to exit.
func (s *Served) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Kill kills the server (SIGKILL), as a crash, and waits for it to exit.
func (s *Served) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// logWriter passes the server's stderr to the test's log (dropped once the test ended).
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("kloud store serve: " + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
