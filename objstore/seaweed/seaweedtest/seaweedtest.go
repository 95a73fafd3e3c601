// Package seaweedtest gives tests a real SeaweedFS S3 server: Start returns the test process's
// one weed server (objstore/seaweed), started on first use and shared by every test of the
// process; each test makes buckets of names of its own (Name) and tags them with an instance of
// its own. The weed binary is $KLOUD_WEED (scripts/setup.sh writes it into the cache's env).
//
// The server ends with the test process, however that ends: weed gets SIGTERM when the process
// dies (Pdeathsig), and a reaper (a shell reading the process's end of a pipe) kills it if it
// still runs, then removes its sockets and its directory (testutil.RunDir, under the cache, not
// the system temp directory).
package seaweedtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/objstore/seaweed"
)

// EnvWeed names the weed binary.
const EnvWeed = "KLOUD_WEED"

var shared struct {
	once   sync.Once
	srv    *seaweed.Server
	err    error
	reaper io.WriteCloser // kept open (and referenced) until the process exits
}

// Start returns the shared server, starting it at the first call. Without $KLOUD_WEED it skips
// the test loudly (fails it under CI=true).
func Start(t testing.TB) *seaweed.Server {
	t.Helper()
	bin := os.Getenv(EnvWeed)
	if bin == "" {
		testutil.Unavailable(t, "$%s (the SeaweedFS weed binary) is not set", EnvWeed)
	}
	if _, err := os.Stat(bin); err != nil {
		testutil.Unavailable(t, "no weed binary: %v", err)
	}
	shared.once.Do(func() { shared.srv, shared.reaper, shared.err = start(bin) })
	if shared.err != nil {
		t.Fatalf("seaweedtest: %v", shared.err)
	}
	return shared.srv
}

func start(bin string) (*seaweed.Server, io.WriteCloser, error) {
	dir, remove, err := testutil.RunDir("weed")
	if err != nil {
		return nil, nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		remove()
		return nil, nil, err
	}
	var out io.Writer = logf
	if os.Getenv("SEAWEEDTEST_LOG") == "stderr" {
		out = io.MultiWriter(logf, os.Stderr)
	}
	s, err := seaweed.Start(context.Background(), seaweed.Options{
		Bin: bin, Dir: filepath.Join(dir, "weed"), Out: out, Log: slog.New(slog.NewTextHandler(out, nil)),
	})
	if err != nil {
		b, _ := os.ReadFile(logf.Name())
		remove()
		return nil, nil, fmt.Errorf("%w; its log:\n%s", err, tail(string(b), 40))
	}
	// The reaper: when this process ends (its pipe's write end closes), kill what still runs
	// of weed (Dir/weed.pid's process, if its working directory is the server's) and remove
	// the server's sockets and directory.
	script := `cat >/dev/null
p=$(cat "$1/weed/weed.pid" 2>/dev/null)
if [ -n "$p" ] && [ "$(readlink /proc/$p/cwd)" = "$1/weed" ]; then kill -KILL "$p"; fi
sleep 0.2
shift; d=$1; shift; rm -f "$@"; rm -rf "$d"`
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "reaper", dir, dir}, s.Sockets()...)...)
	w, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		s.Stop()
		remove()
		return nil, nil, fmt.Errorf("reaper: %w", err)
	}
	go cmd.Wait()
	return s, w, nil
}

// Name returns a bucket name unique to this test process and call: prefix-<8 hex digits>.
func Name(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
