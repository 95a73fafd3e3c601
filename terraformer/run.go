package terraformer

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/metrics"
	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// Config is what cmd/terraformer passes to Run. Zero fields get the defaults in their comments.
type Config struct {
	// Addr is the listen address. Default: ":7001".
	Addr string
	// DataDir holds the kite id, and the engine's stacks and jobs unless SharedDir is set.
	// Default: ~/.kloud/terraformer.
	DataDir string
	// SharedDir, if set, holds the engine's stacks (work dirs, state, files, variables, leases)
	// and jobs in DataDir's place: terraformers started with one SharedDir are a pool (kloud's
	// terraformer/tfpool) that share every stack's state, and any of them can follow, or take
	// over, the others' jobs. It must be one directory all of them reach with working flock(2)
	// (one host, or a shared POSIX filesystem such as NFSv4). Default: DataDir.
	SharedDir string
	// KloudURL is kloud's base URL; its GET /kite/keys gives the keys that verify callers.
	// Default: http://127.0.0.1:7000.
	KloudURL string
	// KloudUsers are the subjects allowed to call. Default: ["kloud"].
	KloudUsers []string
	// Issuer is the iss of the credentials kontrol signs. Default: "kontrol".
	Issuer string
	// KiteID is this kite's id, the audience of tokens for it. Default: the id in
	// DataDir/kite-id, created on first start, so it survives restarts.
	KiteID string
	// TerraformPath is the terraform binary. Default: terraform on PATH, else
	// $KLOUD_CACHE/bin/terraform.
	TerraformPath string
	// CLIConfigFile is Terraform's CLI config, with the offline provider mirror. Default:
	// DefaultCLIConfig(). It must exist.
	CLIConfigFile string
	// HangTimeout, CancelGrace and LeaseTTL are passed to the engine (defaults 10m, 10s, 30s;
	// see tfrun.Options).
	HangTimeout, CancelGrace, LeaseTTL time.Duration
	// SandboxUID and SandboxGID are the user terraform runs as (default 65534); SandboxReadOnly
	// are extra host paths it may read; InsecureNoSandbox runs terraform without the sandbox
	// (development without root only). See tfrun.Options and package tfsandbox.
	SandboxUID, SandboxGID int
	SandboxReadOnly        []string
	InsecureNoSandbox      bool
	// SandboxLimits are the cpu, memory and pids limits of each terraform command's cgroup (nil:
	// none; terraformer serve: tfsandbox.DefaultTerraformLimits). See tfrun.Options.
	SandboxLimits *cgroups.Limits
	// MetricsAddr, if set, also serves GET /metrics there without authentication (on Addr it
	// needs a kite key of kloud or its admin). See metrics.go.
	MetricsAddr string
	// TLS, if set, makes terraformer serve https and wss only (--tls-cert/--tls-key,
	// internal/tlsconf.Server), with Strict-Transport-Security on every answer.
	TLS *tls.Config
	// KloudTLS is what terraformer trusts when KloudURL is https (--ca-cert:
	// internal/tlsconf.Client). Nil: the system's roots.
	KloudTLS *tls.Config
	// Logger receives the logs. Default: discard.
	Logger *slog.Logger
	// Listening, if set, is called with the bound address once terraformer accepts connections.
	Listening func(net.Addr)
}

// DefaultAddr is terraformer's default listen address.
const DefaultAddr = ":7001"

// DefaultCLIConfig returns $TF_CLI_CONFIG_FILE if set, else $KLOUD_CACHE/terraform.tfrc
// (KLOUD_CACHE defaults to /var/cache/kloud), which scripts/tf-mirror.sh writes.
func DefaultCLIConfig() string {
	if p := os.Getenv("TF_CLI_CONFIG_FILE"); p != "" {
		return p
	}
	return cacheCLIConfig()
}

// cacheCLIConfig returns $KLOUD_CACHE/terraform.tfrc.
func cacheCLIConfig() string {
	cache := os.Getenv("KLOUD_CACHE")
	if cache == "" {
		cache = "/var/cache/kloud"
	}
	return filepath.Join(cache, "terraform.tfrc")
}

// DefaultDataDir returns ~/.kloud/terraformer.
func DefaultDataDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(".kloud", "terraformer")
	}
	return filepath.Join(home, ".kloud", "terraformer")
}

// Run serves terraformer until ctx ends: /kite (the kite protocol), /healthz, /readyz and
// /metrics (metrics.go). On the way out
// it cancels the running jobs (SIGINT to terraform, SIGKILL after CancelGrace), which persists
// them and releases their leases, then closes the connections.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.DataDir == "" {
		cfg.DataDir = DefaultDataDir()
	}
	if cfg.KloudURL == "" {
		cfg.KloudURL = DefaultKloudURL
	}
	if cfg.CLIConfigFile == "" {
		cfg.CLIConfigFile = DefaultCLIConfig()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger
	if _, err := os.Stat(cfg.CLIConfigFile); err != nil {
		hint := "run scripts/tf-mirror.sh to build the offline provider mirror and its config, or pass --cli-config"
		if cached := cacheCLIConfig(); cached != cfg.CLIConfigFile {
			if _, cerr := os.Stat(cached); cerr == nil {
				hint = "the mirror's config is " + cached + ": pass --cli-config " + cached
				if os.Getenv("TF_CLI_CONFIG_FILE") == cfg.CLIConfigFile {
					hint = "$TF_CLI_CONFIG_FILE names it; " + hint
				}
			}
		}
		return fmt.Errorf("terraformer: terraform CLI config %s: %w (%s)", cfg.CLIConfigFile, err, hint)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("terraformer: data dir: %w", err)
	}
	if cfg.KiteID == "" {
		id, err := loadKiteID(filepath.Join(cfg.DataDir, "kite-id"))
		if err != nil {
			return fmt.Errorf("terraformer: %w", err)
		}
		cfg.KiteID = id
	}
	m := NewMetrics()
	engineDir := cfg.DataDir
	if cfg.SharedDir != "" {
		engineDir = cfg.SharedDir
	}
	engine, err := tfrun.New(ctx, tfrun.Options{
		Dir: engineDir, TerraformPath: cfg.TerraformPath, CLIConfigFile: cfg.CLIConfigFile,
		HangTimeout: cfg.HangTimeout, CancelGrace: cfg.CancelGrace, LeaseTTL: cfg.LeaseTTL, Logger: log,
		SandboxUID: cfg.SandboxUID, SandboxGID: cfg.SandboxGID, SandboxReadOnly: cfg.SandboxReadOnly, SandboxLimits: cfg.SandboxLimits,
		InsecureNoSandbox: cfg.InsecureNoSandbox, OnFinish: m.OnFinish,
	})
	if err != nil {
		return fmt.Errorf("terraformer: %w", err)
	}
	eo := engine.Options()
	closeEngine := func() error {
		cctx, cancel := context.WithTimeout(context.Background(), eo.CancelGrace+30*time.Second)
		defer cancel()
		return engine.Close(cctx)
	}
	auth := NewAuthenticator(AuthOptions{KloudURL: cfg.KloudURL, Issuer: cfg.Issuer, HTTPClient: tlsconf.HTTPClient(cfg.KloudTLS, 10*time.Second)})
	k, err := kite.New(kite.Options{
		Identity:      kite.Identity{Name: Name, ID: cfg.KiteID, Version: version.Version},
		Authenticator: auth,
		Logger:        log,
		Observer:      m.Kite,
	})
	if err != nil {
		closeEngine()
		return fmt.Errorf("terraformer: %w", err)
	}
	svc, err := New(Options{Engine: engine, Kite: k, KloudUsers: cfg.KloudUsers, Logger: log})
	if err != nil {
		closeEngine()
		return err
	}
	m.Watch(k, engine)
	users := cfg.KloudUsers
	if len(users) == 0 {
		users = []string{"kloud"}
	}
	mctx, stopMetrics := context.WithCancel(ctx)
	defer stopMetrics()
	if cfg.MetricsAddr != "" {
		if err := metrics.Serve(mctx, cfg.MetricsAddr, m.Handler(), log, nil); err != nil {
			closeEngine()
			return fmt.Errorf("terraformer: %w", err)
		}
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		closeEngine()
		return fmt.Errorf("terraformer: listen %s: %w", cfg.Addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", Handler(k, engine, KloudKeysCheck(cfg.KloudURL, tlsconf.HTTPClient(cfg.KloudTLS, 0))))
	mux.Handle("GET /metrics", m.AuthHandler(k, auth, users))
	var h http.Handler = mux
	if cfg.TLS != nil {
		ln = tls.NewListener(ln, cfg.TLS)
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Strict-Transport-Security", tlsconf.HSTS)
			inner.ServeHTTP(w, r)
		})
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("terraformer listening", "addr", ln.Addr().String(), "kite", k.Identity().String(),
		"kloud_url", cfg.KloudURL, "keys_url", KeysURL(cfg.KloudURL), "terraform", eo.TerraformPath,
		"terraform_version", engine.Version(), "cli_config", eo.CLIConfigFile, "data_dir", cfg.DataDir, "stacks_dir", eo.Dir, "pool_id", engine.PoolID())
	if cfg.Listening != nil {
		cfg.Listening(ln.Addr())
	}

	var serveErr error
	select {
	case serveErr = <-errc:
		serveErr = fmt.Errorf("terraformer: serve: %w", serveErr)
	case <-ctx.Done():
	}
	log.Info("terraformer shutting down: cancelling running jobs")
	// Jobs first, so that watchers still connected get their final events.
	if err := closeEngine(); err != nil {
		log.Warn("close engine", "err", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := svc.Drain(sctx); err != nil {
		log.Warn("watchers did not get their final events", "err", err)
	}
	k.Close()
	srv.Shutdown(sctx) //nolint:errcheck // the kite connections are closed already
	log.Info("terraformer stopped")
	return serveErr
}

// Handler serves /kite (k), /healthz (JSON: status, kite id, terraform version, the pool id of
// its engine's directory: the process serves) and /readyz (whether it can run terraform for kloud; see [Readiness]). extra are more
// readiness checks ([Run] adds [KloudKeysCheck]).
func Handler(k *kite.Kite, engine *tfrun.Engine, extra ...ReadyCheck) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/kite", k)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{ //nolint:errcheck // the client went away
			"status": "ok", "kiteId": k.Identity().ID, "version": version.Version, "terraform": engine.Version(),
			"poolId": engine.PoolID(),
		})
	})
	checks := append([]ReadyCheck{terraformCheck(engine), dataDirCheck(engine)}, extra...)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rd := readiness(r.Context(), checks)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !rd.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(rd) //nolint:errcheck // the client went away
	})
	return mux
}

// readyTimeout bounds each readiness check.
const readyTimeout = time.Second

// ReadyCheck is one named readiness check: nil when that part is ready.
type ReadyCheck struct {
	Name  string
	Check func(ctx context.Context) error
}

// Readiness is /readyz's JSON body (tfapi.Readiness).
type Readiness = tfapi.Readiness

// CheckResult is one check's result in [Readiness].
type CheckResult = tfapi.CheckResult

func readiness(ctx context.Context, checks []ReadyCheck) Readiness {
	rd := Readiness{NotReady: []string{}, Checks: map[string]CheckResult{}}
	for _, c := range checks {
		cctx, cancel := context.WithTimeout(ctx, readyTimeout)
		err := c.Check(cctx)
		cancel()
		if err != nil {
			rd.NotReady = append(rd.NotReady, c.Name)
			rd.Checks[c.Name] = CheckResult{Error: err.Error()}
			continue
		}
		rd.Checks[c.Name] = CheckResult{Ready: true}
	}
	rd.Ready = len(rd.NotReady) == 0
	return rd
}

// terraformCheck: the engine found terraform (its version) and the binary is still there.
func terraformCheck(engine *tfrun.Engine) ReadyCheck {
	return ReadyCheck{"terraform", func(context.Context) error {
		if engine.Version() == "" {
			return errors.New("terraform version unknown")
		}
		if _, err := os.Stat(engine.Options().TerraformPath); err != nil {
			return fmt.Errorf("terraform binary: %w", err)
		}
		return nil
	}}
}

// dataDirCheck: a file can be created in the engine's data directory (disk full, read-only
// mount or a removed directory fail it).
func dataDirCheck(engine *tfrun.Engine) ReadyCheck {
	return ReadyCheck{"dataDir", func(context.Context) error {
		f, err := os.CreateTemp(engine.Options().Dir, ".readyz-*")
		if err != nil {
			return err
		}
		f.Close()
		return os.Remove(f.Name())
	}}
}

// KloudKeysCheck: kloud's public keys (GET kloudURL/kite/keys) answer, without which kloud's
// calls cannot be authenticated. hc asks them (nil: net/http's default client).
func KloudKeysCheck(kloudURL string, hc *http.Client) ReadyCheck {
	if hc == nil {
		hc = http.DefaultClient
	}
	u := KeysURL(kloudURL)
	return ReadyCheck{"kloudKeys", func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("kloud's keys: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("kloud's keys at %s: %s", u, resp.Status)
		}
		return nil
	}}
}

// loadKiteID reads the kite id kept in path, or creates one.
func loadKiteID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if err := uuid.Validate(id); err != nil {
			return "", fmt.Errorf("kite id in %s: %w", path, err)
		}
		return id, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("kite id: %w", err)
	}
	id := uuid.NewString()
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("kite id: %w", err)
	}
	return id, nil
}
