package storetest

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// Shared returns a MongoURL and a database name for a test's kloud: a database of its own on
// the test process's shared store server. The server is FerretDB with the SQLite backend, as
// the embedded store, but in a process of its own (cmd storeserver, built without the race
// detector, started at the first call): in a race-built test binary FerretDB builds in its
// debug mode and SQLite is instrumented, and the kloud package spent half of its CPU there.
//
// The same key gives the same database (kloudtest passes the data directory: a kloud restarted
// on its data finds its database). The URL keeps FerretDB v1's rule of one connection per
// client (maxPoolSize=1) and gives a call 60 s to get that connection: on a loaded machine
// calls queue longer than the 1.5 s a MongoURL gets by default. The server and its data go when
// the test process exits, however it ends (the server stops when its standard input closes).
func Shared(t testing.TB, key string) (mongoURL, database string) {
	t.Helper()
	sock, err := sharedServer()
	if err != nil {
		t.Fatalf("shared store server: %v", err)
	}
	sum := sha256.Sum256([]byte(key))
	return "mongodb://" + url.QueryEscape(sock) + "/?maxPoolSize=1&serverSelectionTimeoutMS=60000&connectTimeoutMS=60000",
		"kloud_" + hex.EncodeToString(sum[:8])
}

// The test process's one store server: started once; its stdin's write end stays open (and
// referenced) until the process exits.
var shared struct {
	once  sync.Once
	sock  string
	err   error
	stdin io.WriteCloser
}

func sharedServer() (string, error) {
	shared.once.Do(func() { shared.sock, shared.stdin, shared.err = startShared() })
	return shared.sock, shared.err
}

func startShared() (string, io.WriteCloser, error) {
	bin, err := testutil.CachedBinary("./kloud/store/storetest/storeserver")
	if err != nil {
		return "", nil, err
	}
	dir, remove, err := testutil.RunDir("storeserver")
	if err != nil {
		return "", nil, err
	}
	sock := filepath.Join(dir, "db.sock")
	if len(sock) > 100 {
		remove()
		return "", nil, fmt.Errorf("socket path %s is too long for a unix socket (set KLOUD_CACHE to a shorter directory)", sock)
	}
	cmd := exec.Command(bin, "-dir", dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		remove()
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		remove()
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		remove()
		return "", nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go cmd.Wait() // reaped whenever it ends
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("unexpected first line %q", line)
		}
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-time.After(time.Minute):
		err = fmt.Errorf("not ready after a minute")
	}
	if err != nil {
		stdin.Close() // it stops and removes dir
		return "", nil, fmt.Errorf("storeserver: %w", err)
	}
	return sock, stdin, nil
}
