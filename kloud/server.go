// Package kloud is the orchestrator: users and teams, credentials, templates, stacks, machines
// and durable jobs, on a Mongo store; it hosts kontrol and serves the kite endpoint, the klient
// download and the web UI.
//
// Start with New (wiring: store, signing keys, kontrol, providers, terraformer) and Serve, then
// routes.go: the one table of every RPC method (with its params type and who may call it),
// every HTTP route, every job kind and every background task. The methods' names, params and
// results are in package api (kloud/api, with a typed client); docs/protocol.md is the wire
// contract. The handlers live one area per file (users.go, credentials.go, templates.go,
// stacks.go, machines.go, jobs.go); each gets the resolved Caller (authz.go) and checks what it
// may do. Long work runs as durable jobs (jobs.go) that survive a restart. Documents (package
// kloud/model, aliased in model.go) are read and written only through kloud/store's typed
// repositories; store errors become kite error codes in one place, errors.go.
package kloud

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/internal/filehash"
	"github.com/kloud-dev/kloud/internal/metrics"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/events"
	"github.com/kloud-dev/kloud/kloud/idle"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/login"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/pluginhost"
	"github.com/kloud-dev/kloud/kloud/quota"
	"github.com/kloud-dev/kloud/kloud/relay"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kontrol"
	"github.com/kloud-dev/kloud/provider"
)

// Defaults of Options, applied by Options.defaults; kloud serve's flags take theirs from these.
const (
	DefaultAddr              = ":7000"
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultHeartbeatTimeout  = 10 * time.Second
	DefaultJobLease          = 30 * time.Second
	// DefaultReconcileInterval is how often the reconciler looks for stuck states (reconcile.go).
	DefaultReconcileInterval = 30 * time.Second
	// Retention (retention.go): finished jobs kept 30 days, presence records of a gone replica
	// 24h, pruned every hour.
	DefaultRetentionJobs     = 30 * 24 * time.Hour
	DefaultRetentionKites    = 24 * time.Hour
	DefaultRetentionInterval = time.Hour
	// DefaultRetentionAudit: audit log entries are kept a year (audit.go).
	DefaultRetentionAudit = 365 * 24 * time.Hour
	// DefaultAgentTimeout is how long a build or a machine start waits for a machine's agent
	// to register, answer and finish provisioning before it names the step that failed.
	DefaultAgentTimeout = 5 * time.Minute
)

// Options configures New. Zero fields take the defaults above (and DefaultDataDir).
type Options struct {
	DataDir string // default ~/.kloud
	Addr    string // listen address, default DefaultAddr (":7000")
	// PublicURL is how users and kites reach this kloud (written into kite keys), default
	// http://127.0.0.1:<port>. Behind a load balancer: the balancer's URL, the same for every
	// replica.
	PublicURL string
	// InternalURL is how the other kloud replicas on the same store reach this one (kloud
	// serve --internal-url; mesh.go): forwarded agent calls and relayed attachments. Default
	// PublicURL (right for a single replica; several behind a balancer each need their own).
	InternalURL string
	// ReplicaHeartbeat is how often this replica renews its record in the store; a replica
	// silent for ReplicaExpiry (3) heartbeats is dead and swept (mesh.go). Default
	// DefaultReplicaHeartbeat (5s).
	ReplicaHeartbeat time.Duration
	// PeerTLS is what this replica trusts when it dials another's https internal URL (kloud
	// serve: the system's roots plus --ca-cert). Nil: the system's roots.
	PeerTLS *tls.Config
	// MongoURL selects an external MongoDB; empty starts the embedded store in DataDir/db.
	MongoURL string
	// MongoDatabase is the name of kloud's database (default "kloud"): kloud deployments that
	// share one MongoDB each use their own.
	MongoDatabase string
	// HeartbeatInterval and HeartbeatTimeout drop kites whose link went dead without closing
	// (defaults DefaultHeartbeatInterval and DefaultHeartbeatTimeout, 10s and 10s).
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// KlientBin is the klient binary served at /dl/klient (default: "klient" next to this
	// executable).
	KlientBin string
	// AgentRollout: api.AgentRolloutAuto (the default) upgrades every agent that registers with
	// another klient than KlientBin (agentupgrade.go); api.AgentRolloutOff does not.
	AgentRollout string
	// Providers are the providers kloud offers (default: an empty registry, so kloud serves
	// users, templates and credentials but builds no stack; kloud serve registers the
	// built-in providers its flags enable).
	Providers *provider.Registry
	// JobLease is how long a job stays claimed by a kloud that stopped renewing it (crashed)
	// before another start or replica resumes it (default DefaultJobLease, 30s).
	JobLease time.Duration
	// ReconcileInterval is how often kloud moves stacks and machines that a job which is over
	// left in a transition to Failed/Unknown (reconcile.go; it also runs once at startup).
	// Default DefaultReconcileInterval (30s).
	ReconcileInterval time.Duration
	// Retention says how long the store keeps what only grows (finished jobs, expired
	// revocations, presence records of kites whose replica is gone) and how often kloud prunes
	// it (retention.go). Zero fields take the defaults of [Retention].
	Retention Retention
	// AgentTimeout bounds the wait for a machine's agent after terraform made the machine
	// (stack build) or the provider started it (machine.start): default DefaultAgentTimeout
	// (5m). Tests of boot failures set it short.
	AgentTimeout time.Duration
	// SnapshotQuota limits each user's machine snapshots (snapshots.go; zero fields: the
	// defaults, DefaultSnapshotCount and DefaultSnapshotBytes).
	SnapshotQuota SnapshotQuota
	// DefaultQuota is the quota of every user an administrator gave none (quota.go; zero: no
	// limit; kloud serve --default-quota).
	DefaultQuota Quota
	// PluginDir holds the provider plugins kloud launches and supervises, kloud-provider-NAME
	// (kloud/pluginhost). Default <DataDir>/plugins.
	PluginDir string
	// Plugins configure the plugin launcher (kloud/pluginhost; zero: its defaults: sandboxed as
	// uid 65534).
	Plugins PluginOptions
	// Terraformer runs Terraform for kloud (nil: stack and bootstrap work fails with a clear
	// error until one is set with SetTerraformer).
	Terraformer Terraformer
	// AppsHost is the host under which machines' web apps get their own origins,
	// p<port>--m<machine id>.<AppsHost> (kloud/relay): default DefaultAppsHost
	// ("localhost", on kloud's port); "off" turns web apps off (kloud port-forward still works).
	AppsHost string
	// GC configures the garbage collection of the providers' resources: the periodic sweep and
	// the grace period (gc.go; zero: its defaults).
	GC GCOptions
	// Limits caps machines per stack and the wall time of plans (limits.go; zero fields: its
	// defaults).
	Limits Limits
	// MetricsAddr, if set, also serves GET /metrics there without authentication (kloud serve
	// --metrics-addr; on the main address it is for kloud administrators). See metrics.go.
	MetricsAddr string
	// MetricsInterval is how often the machines' figures (their klient's kite.systemInfo) and
	// the quota use are polled for the metrics (default DefaultMetricsInterval, 15s).
	MetricsInterval time.Duration
	// SSO configures OpenID Connect login beside passwords (kloud/login; kloud serve
	// --oidc-*); an empty Issuer turns it off.
	SSO SSOOptions
	// Doctor are more checks kloud.doctor runs (doctor.go; kloud serve adds the provider
	// mirror's and the local provider's base image's).
	Doctor []DoctorCheck
	// TLS, if set, makes kloud serve https and wss only (kloud serve --tls-cert/--tls-key,
	// internal/tlsconf.Server): a plain-http request gets 400 "Client sent an HTTP request to an
	// HTTPS server", every answer carries Strict-Transport-Security, session and app cookies are
	// Secure, and PublicURL defaults to https://127.0.0.1:<port>.
	TLS *tls.Config
	// CACert is the PEM of the CA that signed kloud's certificate when no public CA did (kloud
	// serve --ca-cert): machines' user data carries it, so their klient (and the download of
	// klient) trust kloud. Empty: machines trust their system's roots only.
	CACert string
	// Browser is how browsers and the proxies in front of kloud are treated: allowed origins,
	// the session cookie's Secure, SameSite and Domain, trusted proxies (kloudhttp.Browser;
	// kloud serve --allowed-origin, --cookie-*, --trusted-proxy). Zero: kloud alone on its address.
	Browser kloudhttp.Browser
	// Idle configures the idle stop (idle.go; zero: its defaults, no timeout of kloud's own).
	Idle   IdleOptions
	Logger *slog.Logger
	// Listening, if set, is called with the bound address once the server accepts connections.
	Listening func(addr net.Addr)
	// Events is the hub the store's changes are published to and event.watch streams from
	// (eventfeed.go). Default: a new events.New hub of this process.
	Events events.Hub
	// Replicas says this kloud is one of several replicas sharing MongoURL (kloud serve
	// --replicas; needs MongoURL): what each publishes to its event hub and its kites'
	// registrations go through the store's change log to the others' hubs and kontrol.watch
	// streams (eventlog.go). Default off: one kloud pays nothing for it.
	Replicas bool
	// EventLog tunes that change log (zero: its defaults).
	EventLog EventLogOptions
}

// Admin is the username of the administrator the first start creates a kite key for.
const Admin = "admin"

// Files in the data directory.
const (
	AdminKeyFile    = "admin.key"
	KloudKeyFile    = "kloud.key" // kloud's own identity towards terraformer
	KeyringFile     = "kontrol/keys.json"
	RevocationsFile = "kontrol/revocations.json"
)

// Issuer is the iss claim of everything kloud's kontrol signs.
const Issuer = "kontrol"

// DefaultDataDir returns ~/.kloud.
func DefaultDataDir() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ".kloud"
	}
	return filepath.Join(home, ".kloud")
}

// Server is a kloud.
type Server struct {
	opts      Options
	log       *slog.Logger
	store     *store.Store
	keyring   *kitekey.Keyring
	providers *provider.Registry
	Kite      *kite.Kite
	Kontrol   *kontrol.Kontrol
	mux       *http.ServeMux

	mu        sync.RWMutex
	tf        Terraformer
	klientSum string
	presence  *storePresence
	mesh      *mesh // this replica among the others (mesh.go)
	revs      *storeRevocations
	relay     *relay.Hub    // terminals, port forwards, web apps on their own hosts (relay.go)
	idle      *idle.Tracker // the idle stop and autostart (kloud/idle, wired in idle.go)

	metrics *kloudMetrics    // Prometheus collectors (metrics.go)
	login   *login.Service   // the web login: passwords, sessions, single sign-on (kloud/login, wired in web_api_login.go)
	rate    *rateLimiter     // each user's calls (ratelimit.go); nil: no limit
	plugins *pluginhost.Host // provider plugins: launched, registered, proxies in providers (kloud/pluginhost)

	build *stackbuild.Flow // the build flow (stacks_deps.go), built once in New
	quota *quota.Keeper    // quota accounting (quota.go), built once in New

	// area APIs: the handlers of one area each, on a small type holding what they use
	creds     *credentialAPI  // credential.*, provider.describe (credentials.go, credential_bootstrap.go)
	templates *templateAPI    // template.create, update, get, list, delete (templates.go)
	machines  *machineAPI     // machine.list, info, start, stop and their jobs (machines.go)
	shares    *shareAPI       // machine.share, unshare, shares (shares.go)
	ports     *portAPI        // machine.ports.* (ports.go)
	snapshots *snapshotAPI    // machine.snapshot, snapshots, restore, snapshot.delete and their jobs (snapshots.go)
	buckets   *bucketAPI      // bucket.* (buckets.go)
	stacks    *stackAPI       // stack.*: stacks*.go, reconcile.go, constraints.go
	audits    *auditLog       // the audit log and audit.* (audit.go)
	ops       *opsAPI         // kloud.version, kloud.doctor, gc.run, /readyz, /metrics (health.go)
	pruner    *pruner         // the retention passes (retention.go)
	pluginAPI *pluginAPI      // plugin.register, provider.list, provider.keyCreate (plugins.go)
	idleAPI   *idleAPI        // machine.set (idle.go)
	agents    *agentAPI       // machine.upgradeAgent and the agent rollout (agentupgrade.go)
	jobs      *jobRunner      // durable jobs and job.* (jobs.go)
	quotaAPI  *quotaAPI       // quota.* (quota.go)
	poolAPI   *poolAPI        // pool.* (pools.go)
	poolKick  chan struct{}   // cap 1: a pool changed or lost a stack; reconcile the pools now (pools.go)
	users     *userAPI        // user.* and team.* (users.go)
	policy    *templatePolicy // the template policy, template.trust and template.untrust (policy.go)
	backup    *backupAPI      // GET /api/admin/backup (backup.go)
	feed      *eventFeed      // the store's changes to the event hub (eventfeed.go)
	elog      *eventLog       // with Options.Replicas: the other replicas' events (eventlog.go)
	events    *eventAPI       // event.watch (eventfeed.go)
}

// New prepares a server: data directory, store, keys, kite, kontrol and methods.
func New(ctx context.Context, opts Options) (*Server, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("kloud: data dir: %w", err)
	}
	m := newKloudMetrics()
	feed := newEventFeed(opts.Events, opts.Logger) // eventfeed.go
	st, err := store.Open(ctx, store.Options{MongoURL: opts.MongoURL, Database: opts.MongoDatabase, DataDir: opts.DataDir, Logger: opts.Logger, JobLeaseTTL: opts.JobLease,
		OnCommand: m.storeCommand, OnChange: feed.onChange})
	if err != nil {
		return nil, fmt.Errorf("kloud: %w", err)
	}
	s := &Server{opts: opts, log: opts.Logger, store: st, providers: opts.Providers, mux: http.NewServeMux(), tf: opts.Terraformer, metrics: m,
		rate: newRateLimiter(opts.Limits.RateLimit, opts.Limits.RateBurst, maxRateBuckets), feed: feed}
	feed.st = st
	if opts.Replicas {
		s.elog = newEventLog(st, opts.Events, nil, opts.EventLog, opts.Logger) // eventlog.go
		feed.hub = sharedHub{Hub: opts.Events, l: s.elog}
	}
	ok := false
	defer func() {
		if !ok {
			st.Close(context.Background())
		}
	}()
	if err := s.importFileKeys(ctx); err != nil {
		return nil, err
	}
	s.keyring, err = kitekey.NewKeyring(ctx, kitekey.KeyringOptions{Store: storeKeys{st.Keys()}})
	if err != nil {
		return nil, fmt.Errorf("kloud: signing keys: %w", err)
	}
	revs := newStoreRevocations(st.Revocations())
	s.revs = revs
	s.presence = newStorePresence(st.Kites(), st.InstanceID(), opts.Logger)
	s.mesh = newMesh(s)
	revs.alone = s.mesh.alone
	verifier := &kitekey.Verifier{Keys: s.keyring, Issuer: Issuer, Revoked: revs}
	isAdmin := func(u string) bool { return u == Admin }
	s.Kite, err = kite.New(kite.Options{
		Identity:      kite.Identity{Name: "kloud", Version: version.Version, Username: "kloud"},
		Authenticator: &kitekey.Authenticator{Verifier: verifier, IsAdmin: isAdmin, Agents: true, Plugins: true, Replicas: true},
		GateBuiltins:  kitekey.RefuseAgents,
		Logger:        opts.Logger,
		PingInterval:  opts.HeartbeatInterval,
		PingTimeout:   opts.HeartbeatTimeout,
		Observer:      m.Kite(),
		// Browsers on the public URL's host (behind a proxy that rewrites Host) and the allowed origins.
		OriginPatterns: opts.Browser.OriginPatterns(opts.PublicURL),
		TLSConfig:      opts.PeerTLS, // mesh.go: links to other replicas
	})
	if err != nil {
		return nil, fmt.Errorf("kloud: %w", err)
	}
	s.Kontrol, err = kontrol.New(kontrol.Options{
		Kite: s.Kite, Keyring: s.keyring, Revocations: revs, URL: opts.PublicURL + "/kite", Issuer: Issuer,
		IsAdmin: isAdmin, Presence: s.presence, Logger: opts.Logger,
		Elsewhere: s.mesh.elsewhere, // mesh.go: other replicas' agents
		Authorize: s.authorizeKite, OnEvent: s.kiteEvent,
		Wrap: s.auditKontrol, // audit.go
	})
	if err != nil {
		return nil, fmt.Errorf("kloud: %w", err)
	}
	if s.elog != nil {
		s.elog.kontrol = s.Kontrol
	}
	if err := s.ensureAdmin(ctx); err != nil {
		return nil, err
	}
	s.loadKlient()
	if s.plugins, err = pluginhost.New(pluginhost.Options{Registry: s.providers, Keys: s.Kontrol, Dir: opts.PluginDir,
		StateDir: filepath.Join(opts.DataDir, "plugin-state"), Launch: opts.Plugins, TLS: opts.TLS != nil, CACert: opts.CACert,
		PublicURL: opts.PublicURL, KloudVersion: version.Version, Logger: opts.Logger,
		Peers: pluginPeers{s.mesh}}); err != nil { // mesh_plugins.go
		return nil, fmt.Errorf("kloud: %w", err)
	}
	s.quota = newQuotaKeeper(s)
	// area APIs (one line each)
	s.creds = &credentialAPI{creds: st.Credentials(), stacks: st.Stacks(), jobs: st.Jobs(), vault: st, providers: s.providers, log: s.log, srv: s}
	s.templates = &templateAPI{templates: st.Templates(), now: st.Now, srv: s}
	s.machines = &machineAPI{machines: st.Machines(), stacks: st.Stacks(), providers: s.providers, log: s.log, idle: func() *idle.Tracker { return s.idle }, k: s}
	s.shares = &shareAPI{machines: st.Machines(), users: st.Users(), log: s.log, k: s}
	s.ports = &portAPI{store: st, log: s.log, k: s}
	s.snapshots = &snapshotAPI{engine: newSnapshotEngine(s), snaps: st.Snapshots(), loadMachine: s.loadMachine}
	s.buckets = &bucketAPI{claims: st.BucketClaims(), stacks: st.Stacks(), caller: s.callerByName, loadStack: s.loadStack, flow: s.flow,
		machines: st.Machines(), agentConn: s.agentConn, log: s.log}
	s.stacks = &stackAPI{store: st, stacks: st.Stacks(), machines: st.Machines(), creds: st.Credentials(), providers: s.providers, log: s.log, srv: s, checks: s}
	s.audits = &auditLog{entries: st.Audit(), users: st.Users(), now: st.Now, log: s.log} // audit.go
	s.ops, s.pruner = newOpsAPI(s), &pruner{store: st, opts: opts.Retention, audits: s.audits, log: s.log}
	s.pluginAPI = &pluginAPI{host: s.plugins} // plugins.go
	s.idleAPI = &idleAPI{machines: st.Machines(), now: st.Now, loadMachine: s.loadMachine, capable: s.capable, show: s.showIdle}
	s.agents = (&agentAPI{machines: st.Machines(), loadMachine: s.loadMachine, agentConn: s.agentConn, conn: s.Kontrol.Conn,
		klientSum: func() string { return s.klientSum }, rollout: opts.AgentRollout, log: s.log}).init()
	s.jobs = &jobRunner{store: st, log: s.log, metrics: m, kinds: s.jobKinds(), lease: opts.JobLease, bind: func(j *jobCtx) { j.s = s }}
	s.quotaAPI = &quotaAPI{store: st, keeper: s.quotas(), log: s.log}
	s.poolAPI = &poolAPI{store: st, srv: s, log: s.log}
	s.poolKick = make(chan struct{}, 1)
	s.policy = &templatePolicy{templates: st.Templates(), providers: s.providers, now: st.Now, log: s.log, loadTemplate: s.loadTemplate}
	s.backup = &backupAPI{dataDir: opts.DataDir, store: st, log: s.log, caller: s.httpCaller}
	s.events = &eventAPI{hub: opts.Events, log: s.log} // eventfeed.go
	s.users = &userAPI{users: st.Users(), teams: st.Teams(), now: st.Now, log: s.log, dir: s}
	s.build = newFlow(s)                        // after the area APIs: the flow reaches s.stacks
	if s.login, err = newLogin(s); err != nil { // web_api_login.go
		return nil, fmt.Errorf("kloud: %w", err)
	}
	if s.idle, err = newIdle(s); err != nil { // idle.go
		return nil, fmt.Errorf("kloud: %w", err)
	}
	if s.relay, err = newRelay(s); err != nil {
		return nil, err
	}
	revs.mu.Lock()
	revs.onRevoke = func(jti string) { s.relay.CloseCredential(jti) } // kite connections: kontrol and login close theirs
	// Revoked by another replica (storeadapt.go): close what its kontrol and login closed there.
	revs.onRemote = func(jti string) {
		n := s.relay.CloseCredential(jti)
		for _, c := range s.Kite.Conns() {
			if p := c.Principal(); p != nil && p.TokenID == jti {
				c.Close(fmt.Errorf("credential %s revoked", jti))
				n++
			}
		}
		if n > 0 {
			s.log.Info("closed the connections of a credential another replica revoked", "jti", jti, "connections", n)
		}
	}
	revs.mu.Unlock()
	if err := newMetricsPoller(s); err != nil { // metrics.go
		return nil, fmt.Errorf("kloud: %w", err)
	}
	s.routes()
	ok = true
	return s, nil
}

func (o *Options) defaults() error {
	if err := o.Browser.Validate(); err != nil {
		return fmt.Errorf("kloud: %w", err)
	}
	if o.Replicas && o.MongoURL == "" {
		return errors.New("kloud: several replicas (Replicas) share a MongoURL; the embedded store serves one kloud")
	}
	if o.DataDir == "" {
		o.DataDir = DefaultDataDir()
	}
	if o.Addr == "" {
		o.Addr = DefaultAddr
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if o.JobLease <= 0 {
		o.JobLease = DefaultJobLease
	}
	if o.ReconcileInterval <= 0 {
		o.ReconcileInterval = DefaultReconcileInterval
	}
	o.Retention.defaults()
	o.GC.defaults() // gc.go
	// limits.go
	if err := o.Limits.defaults(); err != nil {
		return err
	}
	if err := o.SSO.Defaults(); err != nil { // kloud/login
		return err
	}
	if err := o.Idle.Defaults(); err != nil { // idle.go
		return err
	}
	if o.AgentTimeout <= 0 {
		o.AgentTimeout = DefaultAgentTimeout
	}
	if o.MetricsInterval <= 0 {
		o.MetricsInterval = DefaultMetricsInterval
	}
	if o.Providers == nil {
		o.Providers = provider.NewRegistry()
	}
	if o.Events == nil {
		o.Events = events.New(events.Options{})
	}
	if o.PluginDir == "" {
		o.PluginDir = filepath.Join(o.DataDir, "plugins")
	}
	if o.PublicURL == "" {
		_, port, err := net.SplitHostPort(o.Addr)
		if err != nil {
			return fmt.Errorf("kloud: --addr %q: %w", o.Addr, err)
		}
		scheme := "http"
		if o.TLS != nil {
			scheme = "https"
		}
		o.PublicURL = scheme + "://127.0.0.1:" + port
	}
	if o.InternalURL == "" {
		o.InternalURL = o.PublicURL
	}
	if o.ReplicaHeartbeat <= 0 {
		o.ReplicaHeartbeat = DefaultReplicaHeartbeat
	}
	if o.TLS != nil && !strings.HasPrefix(o.PublicURL, "https://") {
		return fmt.Errorf("kloud: --public-url %s: with --tls-cert kloud serves https only: give an https:// URL", o.PublicURL)
	}
	switch o.AgentRollout {
	case "":
		o.AgentRollout = api.AgentRolloutAuto
	case api.AgentRolloutAuto, api.AgentRolloutOff:
	default:
		return fmt.Errorf("kloud: agent rollout %q: want %s or %s", o.AgentRollout, api.AgentRolloutAuto, api.AgentRolloutOff)
	}
	if o.KlientBin == "" {
		if exe, err := os.Executable(); err == nil {
			o.KlientBin = filepath.Join(filepath.Dir(exe), "klient")
		}
	}
	return nil
}

// Providers returns the providers this kloud offers.
func (s *Server) Providers() *provider.Registry { return s.providers }

// TLS is the server's TLS configuration (nil: plain http).
func (s *Server) TLS() *tls.Config { return s.opts.TLS }

// PublicURL is how users reach this kloud.
func (s *Server) PublicURL() string { return s.opts.PublicURL }

// Store returns the server's store.
func (s *Server) Store() *store.Store { return s.store }

// Signer mints kite keys, tokens and sessions.
func (s *Server) Signer() *kitekey.Signer { return s.Kontrol.Signer() }

// SetTerraformer sets the terraformer client (when it is started after kloud).
func (s *Server) SetTerraformer(t Terraformer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tf = t
}

func (s *Server) terraformer() (Terraformer, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.tf == nil {
		return nil, fmt.Errorf("no terraformer configured: start kloud with --terraformer-url: %w", kite.ErrState)
	}
	return s.tf, nil
}

// AdminKeyPath is where the admin kite key lives.
func (s *Server) AdminKeyPath() string { return filepath.Join(s.opts.DataDir, AdminKeyFile) }

// KloudKeyPath is where kloud's own kite key (for terraformer) lives.
func (s *Server) KloudKeyPath() string { return filepath.Join(s.opts.DataDir, KloudKeyFile) }

// ensureAdmin creates, on first start, the admin kite key, kloud's own key and the default
// team.
func (s *Server) ensureAdmin(ctx context.Context) error {
	for _, k := range []struct{ path, user string }{{s.AdminKeyPath(), Admin}, {s.KloudKeyPath(), "kloud"}} {
		if _, err := os.Stat(k.path); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kloud: %s: %w", k.path, err)
		}
		key, _, err := s.Kontrol.CreateKey(k.user, "")
		if err != nil {
			return fmt.Errorf("kloud: %s key: %w", k.user, err)
		}
		if err := kitekey.WriteFile(k.path, key); err != nil {
			return fmt.Errorf("kloud: %w", err)
		}
		s.log.InfoContext(ctx, "created kite key", "user", k.user, "path", k.path)
	}
	t := model.Team{Slug: model.DefaultTeam, Title: "Default team", Members: []model.Member{{Username: Admin, Role: model.RoleAdmin}}, CreatedAt: s.store.Now()}
	if err := s.store.Teams().Insert(ctx, t); err != nil && !errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("kloud: default team: %w", err)
	}
	return nil
}

// importFileKeys moves the signing keys of a kloud that kept them in its data dir (before the
// store existed) into the store, so kite keys it issued keep working.
func (s *Server) importFileKeys(ctx context.Context) error {
	path := filepath.Join(s.opts.DataDir, KeyringFile)
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	have, err := s.store.Keys().List(ctx)
	if err != nil {
		return fmt.Errorf("kloud: signing keys: %w", err)
	}
	if len(have) > 0 {
		return nil
	}
	keys, err := (&kitekey.FileStore{Path: path}).LoadKeys(ctx)
	if err != nil {
		return fmt.Errorf("kloud: import %s: %w", path, err)
	}
	sk := storeKeys{s.store.Keys()}
	for _, k := range keys {
		if err := sk.AddKey(ctx, k); err != nil {
			return fmt.Errorf("kloud: import key %s: %w", k.ID, err)
		}
	}
	s.log.InfoContext(ctx, "imported signing keys into the store", "from", path, "keys", len(keys))
	return os.Rename(path, path+".imported")
}

func (s *Server) loadKlient() {
	sum, err := filehash.SHA256(s.opts.KlientBin)
	if err != nil {
		s.log.Warn("no klient binary to serve at /dl/klient; machines cannot install their agent", "path", s.opts.KlientBin, "err", err)
		return
	}
	s.klientSum = sum
}

// Handle adds an HTTP handler (the web UI and its API add themselves).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.rootHandler() }

// Serve listens on opts.Addr and serves until ctx ends, then shuts down and closes the store.
func (s *Server) Serve(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("kloud: listen %s: %w", s.opts.Addr, err)
	}
	return s.ServeListener(ctx, ln)
}

// ServeListener serves on ln until ctx ends.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.rootHandler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)} // e.g. "TLS handshake error"
	if s.opts.MetricsAddr != "" { // metrics.go: also unauthenticated on its own address
		if err := metrics.Serve(ctx, s.opts.MetricsAddr, s.MetricsHandler(), s.log, nil); err != nil {
			s.Close()
			return fmt.Errorf("kloud: %w", err)
		}
	}
	if s.opts.TLS != nil {
		ln = tls.NewListener(ln, s.opts.TLS)
	}
	if s.opts.Listening != nil {
		s.opts.Listening(ln.Addr())
	}
	s.plugins.SetKiteURL(pluginhost.LoopbackKiteURL(ln.Addr(), s.opts.TLS != nil))
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	s.startBackground(bctx)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		stop()
		<-s.plugins.Done()
		s.Close()
		return fmt.Errorf("kloud: serve: %w", err)
	case <-ctx.Done():
	}
	// Plugins first (SIGTERM, SIGKILL after their grace), while their connections still work.
	<-s.plugins.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.Kite.Close()
	srv.Shutdown(sctx)
	select { // the replica's leave (its records) before the store closes
	case <-s.mesh.done:
	case <-sctx.Done():
	}
	s.Close()
	return nil
}

// startBackground starts the background tasks of the route table (routes.go).
func (s *Server) startBackground(ctx context.Context) {
	for _, f := range s.backgroundTasks() {
		go f(ctx)
	}
}

// Close releases the store. Serve calls it.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.store.Close(ctx)
}

// authorizeKite decides who may see and get tokens for a kite: its owner, kloud admins, and
// users a machine is shared with (the machine's klient checks their grant itself).
func (s *Server) authorizeKite(ctx context.Context, caller *kite.Principal, target kite.Identity) error {
	if caller == nil || kitekey.IsRestricted(caller) {
		return fmt.Errorf("kite %s: %w", target.ID, kite.ErrPermission)
	}
	if caller.Username == target.Username || caller.Username == Admin || caller.Username == "kloud" {
		return nil
	}
	if caller.Admin { // a session's admin claim: believed only while the user is still an owner
		c, err := s.callerByName(ctx, caller.Username, caller.Admin)
		if err != nil {
			return fmt.Errorf("kite %s: %w", target.ID, err)
		}
		if c.Admin {
			return nil
		}
	}
	if strings.HasPrefix(target.ID, AgentKitePrefix) {
		shared, err := s.store.Machines().SharedWith(ctx, target.ID, caller.Username)
		if err != nil {
			return fmt.Errorf("kite %s: %w", target.ID, err)
		}
		if shared {
			return nil
		}
	}
	return fmt.Errorf("kite %s belongs to another user: %w", target.ID, kite.ErrPermission)
}
