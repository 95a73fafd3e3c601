// Package klient is the agent that runs on every Kloud machine.
//
// Start with Run: klient reads the kite key cloud-init wrote, dials kontrol, registers (again
// after every reconnect, with backoff), and serves its methods over that same connection, so a
// machine needs no inbound port. kloud reaches it through kontrol. Methods: kite.ping,
// kite.systemInfo, klient.info (identity and provisioning state) and klient.logs (tails of the
// provisioning logs, for build errors that name the failing step). A klient started with
// --vagrant on a user's own host is that user's vagrant host instead (vagranthost.go: the
// vagrant.* methods kloud's vagrant provider calls).
//
// klient must not link provider/, terraformer/ or Mongo (a test checks it).
package klient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/kloud-dev/kloud/internal/selfexec"
	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/vagrant"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/kontrol/kontrolapi"
)

// Options configures klient.
type Options struct {
	KiteKeyFile string // required: the kite.key (default /etc/kloud/kite.key)
	// KontrolURL defaults to the kontrolURL claim of the kite key.
	KontrolURL string
	// Owner is the machine's owner user (default: the owner claim of an agent key, the subject
	// of a kite key).
	Owner       string
	Environment string // default "default"
	Region      string // default "default"
	// Listen, if set (e.g. ":56789"), also accepts direct kite connections there, authenticated
	// with tokens for this kite. Off by default: kloud reaches klient over its registration.
	Listen string
	// Root prefixes the machine paths klient reads (tests); default "/".
	Root string
	// StateDir keeps what klient must remember across restarts (the access list); default
	// Root/var/lib/kloud/klient.
	StateDir string
	// Terminal tunes the web terminal; Owner, Root and Logger are klient's. Its SessionDir
	// SessionDirAuto means DefaultSessionDir when klient is root on a machine (Root "/"), else
	// none (shells end with klient).
	Terminal webterm.Options
	// TLSConfig is what klient trusts when kloud's URL is wss/https (klient --ca-cert:
	// internal/tlsconf.Client). Nil: the system's roots.
	TLSConfig *tls.Config
	// PingInterval/PingTimeout of the connection to kontrol (defaults of package kite).
	PingInterval, PingTimeout time.Duration
	Logger                    *slog.Logger
	// Ready, if set, is called after every successful registration.
	Ready func(kontrolapi.RegisterResult)
	// Vagrant, if set, makes this klient its owner's vagrant host (vagranthost.go): it
	// registers as klientapi.VagrantHostName and serves vagrant.*. It needs a kite key, not a
	// machine's agent key.
	Vagrant *VagrantOptions
}

// The wire types of klient's methods are package klientapi's; these names keep klient's own
// code reading as before.
type (
	Info            = klientapi.Info
	ProvisionState  = klientapi.ProvisionState
	LogsParams      = klientapi.LogsParams
	LogsResult      = klientapi.LogsResult
	Share           = klientapi.Share
	ShareParams     = klientapi.ShareParams
	UnshareParams   = klientapi.UnshareParams
	SetSharesParams = klientapi.SetSharesParams
	SharesResult    = klientapi.SharesResult
)

// SessionDirAuto and DefaultSessionDir: where terminal sessions' holders listen (webterm.Options.SessionDir).
const (
	SessionDirAuto    = "auto"
	DefaultSessionDir = "/run/kloud/sessions"
)

// Klient is a running agent.
type Klient struct {
	opts   Options
	log    *slog.Logger
	hc     *http.Client // dials kloud for terminals and ports (nil: net/http's default)
	kite   *kite.Kite
	client *kite.Client
	claims *kitekey.KeyFile // what the kite.key says: kite id, owner, issuer, kontrol URL
	key    string
	keys   *keyCache

	verifier *kitekey.Verifier
	acl      *acl
	term     *webterm.Manager
	vagrant  *vagrant.Manager // a vagrant host's machines (nil unless Options.Vagrant)
	up       upgrader         // klient.upgrade (upgrade.go) and klient.adopt's restart (adopt.go)
	// ownerFlag: the owner was given (--owner), not taken from the key: klient.adopt refuses,
	// since the restart would keep the old owner's flag.
	ownerFlag bool
	ssh       *sshState       // ssh.go: the SSH server and its connections
	ctx       context.Context // lives until Run returns: attachments run under it
	cancel    context.CancelFunc
}

// New reads the kite key and prepares the agent; Run starts it.
func New(opts Options) (*Klient, error) {
	if opts.KiteKeyFile == "" {
		opts.KiteKeyFile = "/etc/kloud/kite.key"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Root == "" {
		opts.Root = "/"
	}
	key, err := kitekey.ReadFile(opts.KiteKeyFile)
	if err != nil {
		return nil, fmt.Errorf("klient: %w", err)
	}
	claims, err := kitekey.ParseKeyFile(key)
	if err != nil {
		return nil, fmt.Errorf("klient: kite key %s: %w", opts.KiteKeyFile, err)
	}
	if opts.KontrolURL == "" {
		opts.KontrolURL = claims.KontrolURL
	}
	if opts.KontrolURL == "" {
		return nil, errors.New("klient: no kontrol URL: pass --kontrol-url or use a kite key that names one")
	}
	// The owner is the agent key's owner claim (its subject names the machine, not a user); for
	// a plain kite key (tests, hand-run klients) it is the subject.
	ownerFlag := opts.Owner != ""
	switch {
	case opts.Owner == "":
		opts.Owner = claims.Owner
	case claims.Kind == kitekey.KindAgentKey && opts.Owner != claims.Owner:
		return nil, fmt.Errorf("klient: --owner %q, but %s is the agent key of a machine of %q", opts.Owner, opts.KiteKeyFile, claims.Owner)
	}
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(opts.Root, "/var/lib/kloud/klient")
	}
	kl := &Klient{opts: opts, log: opts.Logger, claims: claims, key: key, keys: &keyCache{}, up: upgrader{restart: make(chan string, 1)},
		ownerFlag: ownerFlag}
	verifier := &kitekey.Verifier{Keys: &kitekey.RemoteKeys{Fetch: kl.fetchKeys}, Issuer: claims.Issuer}
	kl.verifier = verifier
	if kl.acl, err = loadACL(filepath.Join(opts.StateDir, SharesFile)); err != nil {
		return nil, fmt.Errorf("klient: %w", err)
	}
	to := opts.Terminal
	to.Owner, to.Root, to.Logger = opts.Owner, opts.Root, opts.Logger
	if to.SessionDir == SessionDirAuto {
		to.SessionDir = ""
		if os.Geteuid() == 0 && filepath.Clean(opts.Root) == "/" {
			to.SessionDir = DefaultSessionDir
		}
	}
	to.HolderEnv = append(to.HolderEnv, selfexec.Env()...)
	if kl.term, err = webterm.New(to); err != nil {
		return nil, fmt.Errorf("klient: %w", err)
	}
	kl.ctx, kl.cancel = context.WithCancel(context.Background())
	name := "klient"
	if opts.Vagrant != nil {
		name = klientapi.VagrantHostName
	}
	k, err := kite.New(kite.Options{
		Identity: kite.Identity{
			Username: claims.Owner, ID: claims.KiteID, Name: name, Version: version.Version,
			Environment: opts.Environment, Region: opts.Region,
		},
		// Tokens (what kloud mints for the users it relays) and kite keys of users; never agent
		// keys: no agent needs to dial another (Agents is off).
		Authenticator: &kitekey.Authenticator{Verifier: verifier},
		Logger:        opts.Logger,
		PingInterval:  opts.PingInterval,
		PingTimeout:   opts.PingTimeout,
		TLSConfig:     opts.TLSConfig,
		// After a network cut a fresh SYN each second: the machine is back with kloud, and its
		// terminals usable, within about a second of its link (docs/RELIABILITY.md "Network cuts").
		ConnectTimeout: reconnectCeiling,
	})
	if err != nil {
		return nil, fmt.Errorf("klient: %w", err)
	}
	kl.kite = k
	if opts.TLSConfig != nil {
		kl.hc = tlsconf.HTTPClient(opts.TLSConfig, 0)
	}
	k.HandleFunc(klientapi.MethodInfo, kl.info)
	k.Handle(klientapi.MethodLogs, kite.Typed(kl.logs))
	kl.handleWebterm()
	kl.handleShares()
	kl.handlePorts()
	kl.handleSSH()      // ssh.go
	kl.handleActivity() // activity.go
	kl.handleBuckets()  // buckets.go
	kl.handleUpgrade()  // upgrade.go
	kl.handleAdopt()    // adopt.go
	if opts.Vagrant != nil {
		if err := kl.setupVagrant(); err != nil {
			kl.cancel()
			kl.term.Detach() // sessions of an earlier klient stay with their holders
			return nil, fmt.Errorf("klient: %w", err)
		}
	}
	return kl, nil
}

// reconnectCeiling is the longest wait between klient's attempts to reach kontrol, and the
// TCP connect timeout of each (a connect that timed out is followed by the next attempt at once,
// kite.Client): after a network cut of any length the agent is back, and its terminals usable,
// within about a second of the link (at 10s, the backoff's old ceiling, a 60s cut took 18s to
// recover). A down kloud costs each klient a refused connect a second at most, drawn at random
// in [0.1s, 1s] so a thousand agents spread out; a kloud more than a second of round trip away
// is not reached.
const reconnectCeiling = time.Second

// Run registers with kontrol and serves until ctx ends, or until an upgrade installed a new
// binary: then it returns a *RestartError (IsRestart), and its caller execs that binary.
func (kl *Klient) Run(ctx context.Context) error {
	kl.client = kl.kite.NewClient(kite.ClientOptions{
		URL: kl.opts.KontrolURL,
		Auth: func(context.Context) (kite.Auth, error) {
			return kite.Auth{Type: kite.AuthKiteKey, Key: kl.key}, nil
		},
		OnConnect:  kl.register,
		MaxBackoff: reconnectCeiling,
	})
	kl.client.Start()
	defer kl.client.Close()
	defer kl.kite.Close()
	defer kl.term.Detach() // sessions with holders live on for the next klient
	defer kl.cancel()
	kl.log.Info("klient starting", "kite", kl.kite.Identity().String(), "kontrol", kl.opts.KontrolURL)
	if kl.opts.Listen != "" {
		ln, err := net.Listen("tcp", kl.opts.Listen)
		if err != nil {
			return fmt.Errorf("klient: listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/kite", kl.kite)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
	}
	select {
	case <-ctx.Done():
		return nil
	case bin := <-kl.up.restart:
		return &RestartError{Binary: bin}
	}
}

func (kl *Klient) register(ctx context.Context, c *kite.Conn) error {
	var res kontrolapi.RegisterResult
	p := kontrolapi.RegisterParams{}
	if kl.opts.Listen != "" {
		p.URL = "http://" + kl.opts.Listen + "/kite"
	}
	if err := c.Call(ctx, kontrolapi.MethodRegister, p, &res); err != nil {
		return fmt.Errorf("kontrol.register: %w", err)
	}
	kl.keys.set(res.Keys)
	kl.log.Info("registered with kontrol", "kite", res.Kite.Kite.String())
	if kl.opts.Ready != nil {
		kl.opts.Ready(res)
	}
	return nil
}

func (kl *Klient) fetchKeys(ctx context.Context) ([]kitekey.PublicKey, error) {
	if kl.client == nil {
		return kl.keys.get(), nil
	}
	var res kontrolapi.KeysResult
	if err := kl.client.Call(ctx, kontrolapi.MethodGetKey, nil, &res); err != nil {
		if k := kl.keys.get(); k != nil {
			return k, nil
		}
		return nil, err
	}
	kl.keys.set(res.Keys)
	return res.Keys, nil
}

// FeatureOwnAccountShells: a terminal share's shells run as the user's own account, not the
// owner's (klientapi.FeatureOwnAccountShells).
const FeatureOwnAccountShells = klientapi.FeatureOwnAccountShells

var started = time.Now().UTC()

func (kl *Klient) info(ctx context.Context, r *kite.Request) (any, error) {
	host, _ := os.Hostname()
	return Info{
		KiteID: kl.claims.KiteID, Owner: kl.opts.Owner, Hostname: host, OS: runtime.GOOS, Arch: runtime.GOARCH,
		Version: version.Version, StartedAt: started, Provision: kl.provisionState(), KontrolURL: kl.opts.KontrolURL,
		Features:   []string{FeatureOwnAccountShells, klientapi.FeaturePortForward, klientapi.FeatureActivity, klientapi.FeatureBuckets, klientapi.FeatureUpgrade, klientapi.FeatureSSH, klientapi.FeatureAdopt},
		SHA256:     kl.ownSHA256(),
		SSHHostKey: kl.hostKeyLine(),
	}, nil
}
