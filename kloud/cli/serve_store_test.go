package cli

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// syncBuf is a log destination a test reads while kloud writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// SyncBuf is syncBuf for the external tests (package cli_test).
type SyncBuf = syncBuf

// TestServeWaitsForTheStore: kloud serve started while its --mongo-url database is down says,
// every few seconds, that it waits for the store at that URL and why, and starts once the
// database is up.
func TestServeWaitsForTheStore(t *testing.T) {
	t.Parallel()
	db := storetest.NewServer(t)
	db.Stop()
	var logs syncBuf
	log := slog.New(slog.NewTextHandler(&logs, nil))
	type result struct {
		s   *kloud.Server
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		s, err := openServer(t.Context(), kloud.Options{DataDir: t.TempDir(), MongoURL: db.URL, Addr: "127.0.0.1:0", Logger: log}, log)
		done <- result{s, err}
	}()
	testutil.Eventually(t, 30*time.Second, func() bool { return strings.Count(logs.String(), "waiting for the store at ") >= 2 },
		"kloud did not say twice that it waits for the store; log:\n%s", logs.String())
	t.Logf("two wait messages after %v", time.Since(start))
	first := logs.String()
	if !strings.Contains(first, "waiting for the store at "+db.URL+" (") || !strings.Contains(first, "store: unavailable") {
		t.Fatalf("wait message does not name the URL and the cause:\n%s", first)
	}
	db.Start()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("kloud did not start once the store was up: %v", r.err)
		}
		r.s.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("kloud still waits after the store came up")
	}
	for _, u := range []string{"mongodb://u:secret@127.0.0.1:27017/db", "mongodb://u:secret@%2Fsock%2Fdb.sock/?maxPoolSize=1"} {
		if got := redactURL(u); strings.Contains(got, "secret") || !strings.Contains(got, "xxxxx@") {
			t.Errorf("redactURL(%s) = %s", u, got)
		}
	}
}
