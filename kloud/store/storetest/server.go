package storetest

import (
	"context"
	"log/slog"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"github.com/FerretDB/FerretDB/ferretdb"

	"github.com/kloud-dev/kloud/kloud/store"
)

// Server is a database server apart from any store: a FerretDB (SQLite backend) serving on a
// unix socket in a test's temporary directory, for tests that give a store a MongoURL and then
// take the database away ([Server.Stop]) and bring it back ([Server.Start]) with its data.
type Server struct {
	t    testing.TB
	dir  string
	sock string
	// URL is the server's mongodb:// URL (maxPoolSize=1: FerretDB v1 with one client).
	URL string

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewServer starts a server; it is stopped when the test ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "db.sock")
	if len(sock) > 100 {
		t.Fatalf("socket path %s is too long for a unix socket", sock)
	}
	s := &Server{t: t, dir: dir, sock: sock, URL: "mongodb://" + url.QueryEscape(sock) + "/?maxPoolSize=1"}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start starts the server (again) on the same socket and data.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return
	}
	f, err := store.NewFerretDB(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{Unix: s.sock},
		Handler:   "sqlite",
		SQLiteURL: "file:" + s.dir + "/",
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		s.t.Fatalf("start ferretdb: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	done := s.done
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
}

// Stop stops the server as a crash would look to its clients: the socket stops accepting at
// once and open connections are closed. It returns once the server has stopped.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
	s.cancel, s.done = nil, nil
}
