// Package storeserve is `kloud store serve`: one process that owns kloud's embedded FerretDB
// (SQLite, in DataDir/db/, with the same file lock as the embedded store) and serves the
// MongoDB wire protocol to many clients (several kloud replicas), executing their commands one
// at a time per database.
//
// Why: FerretDB v1 is not atomic across connections. Its handler runs every update as read,
// modify in Go, write back (kloud/store/doc.go), so two connections racing on one document
// lose updates and both win a compare-and-swap. A single connection is correct because
// FerretDB serves one connection's commands one after another; this server gives every client
// connection a private backend connection to FerretDB (so whatever FerretDB keeps per
// connection stays with its client) and lets one command per database run at a time: a
// single-document update with a condition in its filter is then atomic, as it is on MongoDB,
// and that is all kloud's store relies on.
//
// Start reading at [New] and [Server.Run]; the proxy loop is [Server.serveConn], the message
// parsing is in wire.go.
//
// What it does with the protocol (OP_MSG; OP_QUERY only for the handshake FerretDB accepts):
//   - handshake and diagnostic commands (hello, ping, buildInfo, …, see lockFree) run without
//     the lock; every other command holds its database's lock from the moment it is sent to
//     FerretDB until its reply is read (a slow client reading the reply does not hold it);
//   - cursors: FerretDB v1 keeps cursors in one registry for the whole server, checked by
//     database, collection and user, not by connection; getMore and killCursors are commands
//     like the others (their database's lock) and reach the same backend connection anyway;
//   - moreToCome from a client (an unacknowledged write): executed under the lock, FerretDB's
//     reply (it replies regardless) read and dropped; exhaustAllowed is passed on (FerretDB v1
//     never streams; a reply with moreToCome would be read to its end under the lock);
//   - sessions: FerretDB v1 ignores lsid and has no endSessions; endSessions is answered ok
//     here; a command that starts or continues a transaction is refused (no transactions);
//   - OP_COMPRESSED and other opcodes close the connection (FerretDB offers no compression).
//
// Listening: a unix socket (mode 0600, default DataDir/store.sock), and optionally TCP, which
// requires TLS with client certificates (Options.TLS must require and verify them): a TCP port
// without it would be an open door to every team's data.
package storeserve

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kloud-dev/kloud/kloud/store"
)

// Options configure a [Server].
type Options struct {
	// DataDir holds the data in DataDir/db/ (the embedded store's layout: a kloud's data
	// directory can be served). Required.
	DataDir string
	// Socket is the unix socket to serve. Default: DataDir/store.sock. It is created 0600.
	Socket string
	// TCP, if set, is a host:port to serve as well, with TLS only.
	TCP string
	// TLS is required with TCP and must require and verify client certificates
	// (ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs set).
	TLS *tls.Config
	// Logger. Default: discard.
	Logger *slog.Logger
	// ShutdownGrace is how long Run waits for commands in flight when it stops. Default: 10s.
	ShutdownGrace time.Duration
}

// maxSocketPath is a safe bound for a unix socket path (sun_path is 108 bytes on Linux).
const maxSocketPath = 100

// slowCommand: a command that holds its database this long is logged (at WARN), with its
// collection and name, so an operator sees what keeps the others waiting.
const slowCommand = 500 * time.Millisecond

// Server is a running store server: FerretDB started and its listeners open.
type Server struct {
	opts Options
	log  *slog.Logger
	db   *store.Embedded
	unix net.Listener
	tcp  net.Listener

	locksMu sync.Mutex
	locks   map[string]*sync.Mutex // one per database: a registry, never shrinks

	knownMu sync.Mutex
	known   map[string]bool // "db.coll" whose table got its _id index

	replyID atomic.Int32 // numbers the replies this server makes itself

	connsMu sync.Mutex
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// New starts FerretDB on DataDir (locking it) and opens the listeners; [Server.Run] serves.
func New(opts Options) (_ *Server, err error) {
	if opts.DataDir == "" {
		return nil, errors.New("store serve: a data directory is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 10 * time.Second
	}
	if opts.Socket == "" {
		opts.Socket = filepath.Join(opts.DataDir, "store.sock")
	}
	if opts.Socket, err = filepath.Abs(opts.Socket); err != nil {
		return nil, fmt.Errorf("store serve: %w", err)
	}
	if len(opts.Socket) > maxSocketPath {
		return nil, fmt.Errorf("store serve: socket path %s is too long for a unix socket (at most %d bytes): choose a shorter one", opts.Socket, maxSocketPath)
	}
	if opts.TCP != "" {
		if opts.TLS == nil || opts.TLS.ClientAuth != tls.RequireAndVerifyClientCert || opts.TLS.ClientCAs == nil {
			return nil, errors.New("store serve: TCP requires TLS with verified client certificates (a CA for clients); use the unix socket otherwise")
		}
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("store serve: %w", err)
	}
	s := &Server{opts: opts, log: opts.Logger, locks: map[string]*sync.Mutex{}, known: map[string]bool{}, conns: map[net.Conn]struct{}{}}
	if s.db, err = store.StartEmbedded(opts.DataDir, opts.Logger); err != nil {
		return nil, fmt.Errorf("store serve: %w", err)
	}
	defer func() {
		if err != nil {
			s.closeListeners()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.db.Stop(ctx)
		}
	}()
	// We hold the data directory's lock: a socket left at our path is a dead server's.
	if err := os.Remove(opts.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("store serve: remove stale socket: %w", err)
	}
	old := umask(0o177) // the socket is created 0600: no moment where others may connect
	s.unix, err = net.Listen("unix", opts.Socket)
	umask(old)
	if err != nil {
		return nil, fmt.Errorf("store serve: %w", err)
	}
	if err := os.Chmod(opts.Socket, 0o600); err != nil {
		return nil, fmt.Errorf("store serve: %w", err)
	}
	if opts.TCP != "" {
		if s.tcp, err = tls.Listen("tcp", opts.TCP, opts.TLS); err != nil {
			return nil, fmt.Errorf("store serve: %w", err)
		}
	}
	if err := s.waitBackend(); err != nil {
		return nil, fmt.Errorf("store serve: %w", err)
	}
	return s, nil
}

// waitBackend waits until FerretDB accepts connections on its private socket.
func (s *Server) waitBackend() error {
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.Dial("unix", s.db.Socket())
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ferretdb does not answer on %s: %w", s.db.Socket(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// URL is the mongodb:// URL of the unix socket (clients add their own options, e.g.
// maxPoolSize).
func (s *Server) URL() string { return "mongodb://" + url.QueryEscape(s.opts.Socket) + "/" }

// TCPAddr is the TCP address served, or nil.
func (s *Server) TCPAddr() net.Addr {
	if s.tcp == nil {
		return nil
	}
	return s.tcp.Addr()
}

// Run serves until ctx ends, then stops accepting, closes the client connections (a command
// in flight finishes in FerretDB first, within ShutdownGrace), stops FerretDB and releases the
// data directory.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 2)
	n := 0
	for _, l := range []net.Listener{s.unix, s.tcp} {
		if l == nil {
			continue
		}
		n++
		go func() { errc <- s.accept(l) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("store serve: accept: %w", err)
	}
	s.closeListeners()
	s.connsMu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.connsMu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.opts.ShutdownGrace):
		s.log.Warn("store serve: commands still running at shutdown; stopping FerretDB anyway")
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownGrace)
	defer cancel()
	if serr := s.db.Stop(sctx); serr != nil && err == nil {
		err = fmt.Errorf("store serve: %w", serr)
	}
	_ = os.Remove(s.opts.Socket)
	return err
}

func (s *Server) closeListeners() {
	if s.unix != nil {
		_ = s.unix.Close()
	}
	if s.tcp != nil {
		_ = s.tcp.Close()
	}
}

func (s *Server) accept(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return err
		}
		s.connsMu.Lock()
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.connsMu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.connsMu.Lock()
				delete(s.conns, c)
				s.connsMu.Unlock()
				_ = c.Close()
			}()
			if err := s.serveConn(c); err != nil {
				s.log.Warn("store serve: client connection closed", "remote", c.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

// lock takes database db's lock and returns its unlock.
func (s *Server) lock(db string) func() {
	s.locksMu.Lock()
	m := s.locks[db]
	if m == nil {
		m = &sync.Mutex{}
		s.locks[db] = m
	}
	s.locksMu.Unlock()
	m.Lock()
	return m.Unlock
}

// serveConn proxies one client connection over a backend connection of its own.
func (s *Server) serveConn(c net.Conn) error {
	b, err := net.Dial("unix", s.db.Socket())
	if err != nil {
		return fmt.Errorf("connect to ferretdb: %w", err)
	}
	defer b.Close()
	cr := bufio.NewReader(c)
	br := bufio.NewReader(b)
	for {
		msg, err := readMessage(cr)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		req, err := inspect(msg)
		if err != nil {
			return err
		}
		if req.reply != nil { // answered here (endSessions, a refused transaction)
			if req.moreToCome {
				continue
			}
			if _, err := c.Write(replyMsg(s.replyID.Add(1), req.requestID, req.reply)); err != nil {
				return fmt.Errorf("write reply: %w", err)
			}
			continue
		}
		unlock := func() {}
		if !req.lockFree {
			unlock = s.lock(req.db)
		}
		start := time.Now()
		replies, err := roundTrip(b, br, msg)
		if d := time.Since(start); d >= slowCommand && !req.lockFree {
			s.log.Warn("store serve: slow command (other clients' commands on this database waited for it)",
				"db", req.db, "collection", req.coll, "command", req.cmd, "took", d.Round(time.Millisecond))
		}
		switch {
		case err != nil:
		case req.creates:
			s.indexNew(req.db, req.coll)
		case req.dropDB:
			s.forget(req.db, "")
		case req.dropColl:
			s.forget(req.db, req.coll)
		}
		unlock()
		if err != nil {
			return err
		}
		if req.moreToCome {
			continue // the client asked for no reply
		}
		for _, r := range replies {
			if _, err := c.Write(r); err != nil {
				return fmt.Errorf("write reply: %w", err)
			}
		}
	}
}

// roundTrip sends msg to FerretDB and reads its reply (and the replies that follow one flagged
// moreToCome).
func roundTrip(b net.Conn, br *bufio.Reader, msg []byte) ([][]byte, error) {
	if _, err := b.Write(msg); err != nil {
		return nil, fmt.Errorf("send to ferretdb: %w", err)
	}
	var out [][]byte
	for {
		r, err := readMessage(br)
		if err != nil {
			return nil, fmt.Errorf("read from ferretdb: %w", err)
		}
		out = append(out, r)
		if !replyMoreToCome(r) {
			return out, nil
		}
	}
}

// indexNew gives a collection's table its _id index the first time this server sees a write
// that may have created it (called under the database's lock: FerretDB is not creating or
// dropping tables of that database meanwhile).
func (s *Server) indexNew(db, coll string) {
	key := db + "." + coll
	s.knownMu.Lock()
	seen := s.known[key]
	s.knownMu.Unlock()
	if seen {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.db.IndexIDs(ctx, db); err != nil {
		s.log.Warn("store serve: index _id", "db", db, "err", err)
		return
	}
	s.knownMu.Lock()
	s.known[key] = true
	s.knownMu.Unlock()
}

// forget drops what indexNew knows of database db (after dropDatabase) or of one collection.
func (s *Server) forget(db, coll string) {
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	if coll != "" {
		delete(s.known, db+"."+coll)
		return
	}
	for k := range s.known {
		if len(k) > len(db) && k[:len(db)+1] == db+"." {
			delete(s.known, k)
		}
	}
}
