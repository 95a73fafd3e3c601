// Package kloud is the orchestrator: it hosts kontrol, serves the kite endpoint and (as the
// kloud-core work lands) users, credentials, templates, stacks, machines and jobs.
//
// Start with Serve: it prepares the data directory (signing keys, the admin kite key), builds
// the "kloud" kite with kontrol's methods on it, and serves HTTP: /kite (kite protocol v1),
// /kite/keys (kontrol's public keys, no auth).
package kloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kontrol"
)

// Options configures Serve. Zero fields take the documented defaults.
type Options struct {
	DataDir string // default ~/.kloud
	Addr    string // listen address, default ":7000"
	// PublicURL is how kites reach this kloud (written into kite keys), default
	// http://127.0.0.1:<port>.
	PublicURL string
	// HeartbeatInterval and HeartbeatTimeout drop kites whose link went dead without closing
	// (defaults 10s and 10s).
	HeartbeatInterval, HeartbeatTimeout time.Duration
	Logger                              *slog.Logger
	// Listening, if set, is called with the bound address once the server accepts connections.
	Listening func(addr net.Addr)
}

// Admin is the username of the administrator the first start creates a kite key for.
const Admin = "admin"

// Paths in the data directory.
const (
	AdminKeyFile    = "admin.key"
	KeyringFile     = "kontrol/keys.json"
	RevocationsFile = "kontrol/revocations.json"
)

// DefaultDataDir returns ~/.kloud.
func DefaultDataDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ".kloud"
	}
	return filepath.Join(home, ".kloud")
}

// Server is a running kloud.
type Server struct {
	opts    Options
	log     *slog.Logger
	Kite    *kite.Kite
	Kontrol *kontrol.Kontrol
	mux     *http.ServeMux
}

// New prepares a server: data directory, keys, kite and kontrol.
func New(ctx context.Context, opts Options) (*Server, error) {
	if opts.DataDir == "" {
		opts.DataDir = DefaultDataDir()
	}
	if opts.Addr == "" {
		opts.Addr = ":7000"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 10 * time.Second
	}
	if opts.HeartbeatTimeout == 0 {
		opts.HeartbeatTimeout = 10 * time.Second
	}
	if opts.PublicURL == "" {
		_, port, err := net.SplitHostPort(opts.Addr)
		if err != nil {
			return nil, fmt.Errorf("kloud: --addr %q: %w", opts.Addr, err)
		}
		opts.PublicURL = "http://127.0.0.1:" + port
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("kloud: data dir: %w", err)
	}
	keyring, err := kitekey.LoadOrCreateFileKeyring(filepath.Join(opts.DataDir, KeyringFile))
	if err != nil {
		return nil, fmt.Errorf("kloud: %w", err)
	}
	revs, err := kontrol.OpenFileRevocations(filepath.Join(opts.DataDir, RevocationsFile))
	if err != nil {
		return nil, fmt.Errorf("kloud: %w", err)
	}
	isAdmin := func(u string) bool { return u == Admin }
	verifier := &kitekey.Verifier{Keys: keyring.Keyring, Issuer: "kontrol", Revoked: revs}
	k, err := kite.New(kite.Options{
		Identity:      kite.Identity{Name: "kloud", Version: version.Version, Username: "kloud"},
		Authenticator: &kitekey.Authenticator{Verifier: verifier, IsAdmin: isAdmin},
		Logger:        opts.Logger,
		PingInterval:  opts.HeartbeatInterval,
		PingTimeout:   opts.HeartbeatTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("kloud: %w", err)
	}
	ko, err := kontrol.New(kontrol.Options{
		Kite: k, Keyring: keyring.Keyring, Revocations: revs, URL: opts.PublicURL + "/kite",
		IsAdmin: isAdmin, Logger: opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("kloud: %w", err)
	}
	s := &Server{opts: opts, log: opts.Logger, Kite: k, Kontrol: ko, mux: http.NewServeMux()}
	if err := s.ensureAdminKey(); err != nil {
		return nil, err
	}
	k.HandleFunc("kloud.version", func(context.Context, *kite.Request) (any, error) {
		return map[string]string{"version": version.Version}, nil
	})
	s.mux.Handle("/kite", k)
	s.mux.HandleFunc("GET /kite/keys", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ko.PublicKeys())
	})
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	return s, nil
}

// AdminKeyPath is where the admin kite key lives.
func (s *Server) AdminKeyPath() string { return filepath.Join(s.opts.DataDir, AdminKeyFile) }

func (s *Server) ensureAdminKey() error {
	p := s.AdminKeyPath()
	if _, err := os.Stat(p); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("kloud: admin key: %w", err)
	}
	key, _, err := s.Kontrol.CreateKey(Admin, "")
	if err != nil {
		return fmt.Errorf("kloud: admin key: %w", err)
	}
	if err := kitekey.WriteFile(p, key); err != nil {
		return fmt.Errorf("kloud: admin key: %w", err)
	}
	s.log.Info("created admin kite key", "path", p)
	return nil
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve listens on opts.Addr and serves until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("kloud: listen %s: %w", s.opts.Addr, err)
	}
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
	if s.opts.Listening != nil {
		s.opts.Listening(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("kloud: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.Kite.Close()
	srv.Shutdown(sctx)
	return nil
}
