package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	// ferretdb links every backend it registers; the Makefile's TAGS (ferretdb_no_postgresql)
	// leaves PostgreSQL out: only the SQLite handler is started here.
	"github.com/FerretDB/FerretDB/ferretdb"
	_ "modernc.org/sqlite" // the SQLite driver FerretDB itself uses, for indexID
)

// maxSocketPath is a safe bound for a unix socket path (sun_path is 108 bytes on Linux).
const maxSocketPath = 100

// ferretNewMu serialises ferretdb.New, which is not safe for concurrent use.
var ferretNewMu sync.Mutex

// embedded is a running in-process FerretDB with its data directory locked.
type embedded struct {
	uri    string
	sock   string
	dbDir  string
	lock   *os.File
	tmpDir string // socket directory outside DataDir when DataDir's path is too long; removed at stop
	cancel context.CancelFunc
	done   chan struct{}
}

// startEmbedded locks dataDir/db, starts FerretDB on a unix socket and returns its URI.
func startEmbedded(dataDir string, log *slog.Logger) (_ *embedded, err error) {
	dbDir := filepath.Join(dataDir, "db")
	if err := os.MkdirAll(dbDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded database: %w", err)
	}
	if err := os.Chmod(dbDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded database: %w", err)
	}
	e := &embedded{done: make(chan struct{}), dbDir: dbDir}
	defer func() {
		if err != nil {
			e.release()
		}
	}()

	// One owner per data directory: two FerretDBs on one SQLite directory would corrupt each
	// other's view, and a second client would break the single-connection rule.
	if e.lock, err = os.OpenFile(filepath.Join(dbDir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o600); err != nil {
		return nil, fmt.Errorf("embedded database: %w", err)
	}
	if err = syscall.Flock(int(e.lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("embedded database %s is in use by another kloud process: %w", dbDir, ErrLocked)
		}
		return nil, fmt.Errorf("embedded database: lock %s: %w", dbDir, err)
	}

	sock := filepath.Join(dbDir, "kloud.sock")
	if len(sock) > maxSocketPath {
		if e.tmpDir, err = os.MkdirTemp("", "kloud-db-"); err != nil {
			return nil, fmt.Errorf("embedded database: %w", err)
		}
		sock = filepath.Join(e.tmpDir, "kloud.sock")
	}
	// A socket left by a process that died; we hold the lock, so nobody is serving it.
	if err = os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("embedded database: remove stale socket: %w", err)
	}

	// ferretdb.New writes a package-level variable (version.Get().Package); stores opened
	// concurrently (parallel tests) must not race on it.
	f, err := NewFerretDB(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{Unix: sock},
		Handler:   "sqlite",
		SQLiteURL: "file:" + dbDir + "/",
		Logger:    slog.New(ferretLogHandler{log.Handler()}).With("component", "ferretdb"),
	})
	if err != nil {
		return nil, fmt.Errorf("embedded database: start ferretdb: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		_ = f.Run(ctx)
	}()
	if err = os.Chmod(sock, 0o600); err != nil {
		return nil, fmt.Errorf("embedded database: %w", err)
	}
	e.sock = sock
	e.uri = "mongodb://" + url.QueryEscape(sock) + "/"
	return e, nil
}

// Embedded is the embedded FerretDB started on its own, for a process that serves it to other
// clients itself (kloud/store/storeserve, `kloud store serve`): the same data directory layout
// (DataDir/db/), the same file lock (so neither a kloud nor a second server opens the data
// while it runs) and the same private socket (0600, in DataDir/db/ or a private temporary
// directory). Nothing but that server may connect to the socket: FerretDB v1 is only correct
// with its commands executed one at a time (doc.go).
type Embedded struct{ e *embedded }

// StartEmbedded locks dataDir/db and starts FerretDB on its private socket. Stop it with
// [Embedded.Stop].
func StartEmbedded(dataDir string, log *slog.Logger) (*Embedded, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e, err := startEmbedded(dataDir, log)
	if err != nil {
		return nil, err
	}
	return &Embedded{e: e}, nil
}

// Socket is the path of FerretDB's private unix socket.
func (e *Embedded) Socket() string { return e.e.sock }

// IndexIDs gives every collection of database dbName the SQLite index that makes lookups by
// _id flat (see indexIDs); [Open] does it for the embedded store at start. A database that
// does not exist (no file yet) or whose name is not one FerretDB gives a file is left alone.
func (e *Embedded) IndexIDs(ctx context.Context, dbName string) error {
	if dbName == "" || strings.ContainsAny(dbName, "/\\.\x00") {
		return nil
	}
	if _, err := os.Stat(filepath.Join(e.e.dbDir, dbName+".sqlite")); err != nil {
		return nil
	}
	return e.e.indexIDs(ctx, dbName)
}

// Stop stops FerretDB (its clients should be gone) and releases the data directory.
func (e *Embedded) Stop(ctx context.Context) error { return e.e.stop(ctx) }

// NewFerretDB is ferretdb.New made safe for concurrent use (the embedded store and storetest's
// servers start FerretDBs; ferretdb.New writes a package-level variable).
func NewFerretDB(cfg *ferretdb.Config) (*ferretdb.FerretDB, error) {
	ferretNewMu.Lock()
	defer ferretNewMu.Unlock()
	return ferretdb.New(cfg)
}

// idColumn is the expression FerretDB v1.24's SQLite backend compares when it pushes a filter
// {_id: x} down (internal/backends/sqlite/metadata.IDColumn): WHERE _ferretdb_sjson->'$._id' = ?.
const idColumn = `_ferretdb_sjson->'$._id'`

// indexIDs gives every collection table of database dbName an SQLite index on idColumn.
//
// FerretDB indexes _id on the expression _ferretdb_sjson->"_id", which SQLite does not match to
// the expression its queries compare, so every lookup, update and delete by _id scans the table
// (EXPLAIN QUERY PLAN: SCAN), parsing each row's JSON: a job update cost ~0.4 ms per thousand
// finished jobs kept. With an index on the very expression, SQLite finds the row by the index
// (SEARCH … USING INDEX), whatever the size of the collection. The index is SQLite's business
// only: FerretDB does not list it (its own metadata table knows nothing of it), it goes with its
// table when a collection is dropped, and creating it again is a no-op. FerretDB itself opens
// the database file with many connections, so one more for a moment is what SQLite expects.
func (e *embedded) indexIDs(ctx context.Context, dbName string) error {
	path := filepath.Join(e.dbDir, dbName+".sqlite")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return fmt.Errorf("index _id: %w", err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\_ferretdb%' ESCAPE '\' AND sql LIKE '%_ferretdb_sjson%'`)
	if err != nil {
		return fmt.Errorf("index _id: list tables: %w", err)
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			_ = rows.Close()
			return fmt.Errorf("index _id: %w", err)
		}
		tables = append(tables, t)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("index _id: %w", err)
	}
	for _, t := range tables {
		q := fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %q ON %q (%s)`, "kloud_id_"+t, t, idColumn)
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("index _id of %s: %w", t, err)
		}
	}
	return nil
}

// stop stops FerretDB (after the driver disconnected), waits for it within ctx and releases
// the data directory. If ctx ends first, the directory is released once FerretDB has stopped.
func (e *embedded) stop(ctx context.Context) error {
	if e.cancel == nil {
		e.releaseFiles()
		return nil
	}
	e.cancel()
	select {
	case <-e.done:
		e.releaseFiles()
		return nil
	case <-ctx.Done():
		go func() {
			<-e.done
			e.releaseFiles()
		}()
		return fmt.Errorf("stop embedded database: %w", ctx.Err())
	}
}

// release stops FerretDB if it was started and releases the files (start-up failure path).
func (e *embedded) release() {
	if e.cancel != nil {
		e.cancel()
		<-e.done // Run returns promptly once its ctx is cancelled
	}
	e.releaseFiles()
}

func (e *embedded) releaseFiles() {
	if e.lock != nil {
		_ = e.lock.Close() // drops the flock
	}
	if e.tmpDir != "" {
		_ = os.RemoveAll(e.tmpDir)
	}
}

// ferretLogHandler passes FerretDB's warnings and errors to our logger. FerretDB logs every
// error response at warn level ("Response header: …", "Response message: …"); those are
// errors the driver hands to our code (duplicate keys from lease races, endSessions not
// implemented), so they are dropped here rather than logged twice.
type ferretLogHandler struct{ h slog.Handler }

func (f ferretLogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && f.h.Enabled(ctx, l)
}

func (f ferretLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelError && strings.HasPrefix(r.Message, "Response ") {
		return nil
	}
	return f.h.Handle(ctx, r)
}

func (f ferretLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return ferretLogHandler{f.h.WithAttrs(as)}
}

func (f ferretLogHandler) WithGroup(name string) slog.Handler {
	return ferretLogHandler{f.h.WithGroup(name)}
}
