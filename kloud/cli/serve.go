package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/internal/cgroups"
	"github.com/kloud-dev/kloud/internal/logfmt"
	"github.com/kloud-dev/kloud/internal/sandbox"
	"github.com/kloud-dev/kloud/internal/supervise"
	"github.com/kloud-dev/kloud/internal/tlsconf"
	"github.com/kloud-dev/kloud/internal/version"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/kloud/web"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/tfclient"
	"github.com/kloud-dev/kloud/terraformer/tfpool"
)

// serveFlags are kloud serve's settings beyond kloud.Options.
type serveFlags struct {
	o kloud.Options
	// terraformerURLs: --terraformer-url (repeatable, or a comma list); several make a pool.
	terraformerURLs []string
	// terraformers: --terraformers, how many terraformers kloud starts (a pool when more than
	// one); terraformerAddr their --terraformer-addr (a comma list for several).
	terraformers    int
	terraformerBin  string
	terraformerAddr string
	// tfMetricsAddr passes --metrics-addr to the terraformer kloud starts.
	tfMetricsAddr string
	// tfInsecure passes --insecure-no-sandbox to the terraformer kloud starts.
	tfInsecure bool
	logLevel   string
	logFormat  string
	// trustedProxies: --trusted-proxy (kloud.Options.Browser.TrustedProxies, parsed in runServe).
	trustedProxies []string
	// tlsCert and tlsKey: --tls-cert, --tls-key (kloud.Options.TLS, and the terraformer's).
	tlsCert, tlsKey string
	// pluginLimits and pluginMemMB: --plugin-cpus, --plugin-pids-max, --plugin-memory-mb.
	pluginLimits cgroups.Limits
	pluginMemMB  int64
	// tfLimits and tfMemMB: --terraform-cpus, --terraform-pids-max, --terraform-memory-mb,
	// passed to the terraformer kloud starts.
	tfLimits cgroups.Limits
	tfMemMB  int64

	// The built-in providers' and the demo's own flags and steps (serve_*.go).
	dummy   serveDummy
	local   serveLocal
	docker  serveDocker
	vagrant serveVagrant
	demo    serveDemo
	sso     serveSSO // serve_sso.go
	s3      serveS3  // serve_s3.go: the S3 server of stacks' buckets
}

func serveCmd(g *globals) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run kloud (with kontrol and terraformer) in the foreground",
		Long: `Run kloud in the foreground: the kite endpoint at /kite (kontrol included), the public
signing keys at /kite/keys, the klient download at /dl/klient and the web UI at /.

It serves /healthz (alive) and /readyz (200, or 503 with JSON naming what is not ready: store,
terraformer). With --mongo-url on a store that does not answer at start, it logs "waiting for
the store at URL (cause)" every few seconds until it does; calls during a later outage fail at
once with "store unavailable" (code -32010), and the outage is logged once.

On first start it creates the store (embedded unless --mongo-url), kontrol's signing keys, an
admin kite key and kloud's own key in the data directory, and prints where. Unless
--terraformer-url is given, it starts a terraformer next to it (--terraformers N: N of them, a
pool sharing <data dir>/terraformer), restarts it when it exits (with backoff, logged with the
cause; meanwhile calls that need it fail with "terraformer unavailable", or go to another member
of the pool), and stops it on exit. Several --terraformer-url are a pool of running terraformers
that share one --shared-dir (docs/deployment.md, "A pool of terraformers"). It warns at startup when a provider's machines could not
reach the address it listens on (e.g. --addr 127.0.0.1:7000 with local machines).

It launches every provider plugin kloud-provider-NAME of --plugin-dir (default <data dir>/plugins;
read again every 2 s, so ` + "`kloud provider install`" + ` needs no restart), each as an unprivileged user
(65534) in its own pid and mount namespaces that show it none of kloud's files, with kloud's URL
and a fresh plugin key in its environment; restarts it when it exits (backoff 0.2 s doubling to
30 s), logs its output with provider=NAME, and stops it on exit. Without root, plugins need
--plugin-insecure-no-sandbox (development only). --plugin-unsandboxed NAME lets one plugin run
with kloud's privileges (logged at every start).

With --oidc-issuer, --oidc-client-id and --oidc-client-secret-file, the login page offers "Sign in
with SSO" (OpenID Connect, authorization code flow with PKCE) beside passwords; register
<public URL>/api/oidc/callback as the redirect URI at the provider. A first login creates the user,
bound to the provider's subject; groups (--oidc-groups-claim) naming a kloud team make the user a
member (docs/operations.md, "Single sign-on and roles").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd, g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.o.Addr, "addr", kloud.DefaultAddr, "address to listen on (machines of the local provider reach it on their bridge)")
	fl.StringVar(&f.o.PublicURL, "public-url", "", "URL users and kites reach this kloud at (default http://127.0.0.1:<port>); behind a load balancer, the balancer's, the same for every replica")
	// Several replicas on one store (docs/deployment.md, "Replicas reach each other"): kloud/mesh.go.
	fl.StringVar(&f.o.InternalURL, "internal-url", "", "URL the other kloud replicas on the same store reach this one at (forwarded agent calls, terminal attachments); default --public-url")
	fl.DurationVar(&f.o.ReplicaHeartbeat, "replica-heartbeat", kloud.DefaultReplicaHeartbeat, "how often this replica renews its record in the store; one silent for 3 of them is dead: its agents' presence records are removed")
	// Behind a proxy (docs/admin-guide.md, "Behind a proxy"): kloudhttp.Browser.
	fl.StringSliceVar(&f.o.Browser.AllowedOrigins, "allowed-origin", nil, "browser origin allowed to open kloud's WebSockets besides the public URL's (https://ui.example.com, or a host pattern *.example.com; repeatable)")
	fl.StringVar(&f.o.Browser.CookieSecure, "cookie-secure", "auto", "session cookie Secure: auto (when kloud is reached over https: TLS or an https --public-url), always or never")
	fl.StringVar(&f.o.Browser.CookieSameSite, "cookie-samesite", "strict", "session cookie SameSite: strict or lax")
	fl.StringVar(&f.o.Browser.CookieDomain, "cookie-domain", "", "session cookie Domain (default: none, the host's only)")
	fl.StringSliceVar(&f.trustedProxies, "trusted-proxy", nil, "address or CIDR of a proxy in front of kloud whose X-Forwarded-For and X-Forwarded-Host are believed (repeatable; default none)")
	fl.StringVar(&f.o.AppsHost, "apps-host", kloud.DefaultAppsHost, "host under which machines' web apps get their own origins, p<port>--m<machine>.<host>[:port] (a wildcard DNS name of another domain than the UI's; localhost works in browsers; off: none)")
	fl.StringVar(&f.o.MongoURL, "mongo-url", "", "use this MongoDB instead of the embedded store in the data directory")
	fl.BoolVar(&f.o.Replicas, "replicas", false, "this kloud is one of several replicas sharing --mongo-url: pass events and kontrol.watch between them through the store's change log (docs/deployment.md)")
	fl.StringVar(&f.o.KlientBin, "klient-bin", "", "klient binary to serve to machines (default: klient next to this binary)")
	fl.StringVar(&f.o.AgentRollout, "agent-rollout", api.AgentRolloutAuto, "auto: upgrade every machine agent that connects with another klient than --klient-bin (a few at a time, terminals kept); off: only kloud machine upgrade-agent does")
	fl.DurationVar(&f.o.HeartbeatInterval, "heartbeat", kloud.DefaultHeartbeatInterval, "interval of liveness pings to connected kites")
	fl.DurationVar(&f.o.HeartbeatTimeout, "heartbeat-timeout", kloud.DefaultHeartbeatTimeout, "drop a kite that does not answer a ping within this time")
	fl.StringSliceVar(&f.terraformerURLs, "terraformer-url", nil, "use the terraformer at this URL (default: start one on 127.0.0.1:7001); repeatable, or a comma list: several are a pool, and must share one --shared-dir (docs/deployment.md, \"A pool of terraformers\")")
	fl.IntVar(&f.terraformers, "terraformers", 1, "how many terraformers to start next to kloud when no --terraformer-url is given: more than one are a pool sharing <data dir>/terraformer (docs/deployment.md, \"A pool of terraformers\")")
	fl.StringVar(&f.terraformerBin, "terraformer-bin", "", "terraformer binary to start (default: terraformer next to this binary)")
	fl.BoolVar(&f.tfInsecure, "terraformer-insecure-no-sandbox", false, "start terraformer with --insecure-no-sandbox: terraform runs with kloud's privileges and sees the whole host (development without root only; never where others write templates)")
	fl.StringVar(&f.terraformerAddr, "terraformer-addr", "", "address for the terraformer it starts (default 127.0.0.1:7001, or a free port if that is taken); with --terraformers N, a comma list (missing ones: free loopback ports)")
	fl.StringVar(&f.o.PluginDir, "plugin-dir", "", "directory of provider plugins (kloud-provider-NAME) kloud launches and supervises (default <data dir>/plugins)")
	fl.BoolVar(&f.o.Plugins.Insecure, "plugin-insecure-no-sandbox", false, "launch provider plugins without their sandbox: third-party code runs with kloud's privileges and sees its data directory (development without root only)")
	fl.StringArrayVar(&f.o.Plugins.Unsandboxed, "plugin-unsandboxed", nil, "let the provider plugin NAME run without the sandbox, with kloud's privileges (repeatable; logged at every start; for a plugin that needs the host)")
	fl.Float64Var(&f.tfLimits.CPUs, "terraform-cpus", sandbox.DefaultTerraformLimits.CPUs, "CPUs each terraform command may use, in its own cgroup (passed to the terraformer kloud starts; 0: no limit)")
	fl.Int64Var(&f.tfMemMB, "terraform-memory-mb", sandbox.DefaultTerraformLimits.MemoryBytes>>20, "memory limit in MiB of each terraform command's cgroup (passed to the terraformer kloud starts; 0: no limit)")
	fl.IntVar(&f.tfLimits.PidsMax, "terraform-pids-max", sandbox.DefaultTerraformLimits.PidsMax, "processes and threads limit of each terraform command's cgroup (passed to the terraformer kloud starts; 0: no limit)")
	fl.Float64Var(&f.pluginLimits.CPUs, "plugin-cpus", sandbox.DefaultPluginLimits.CPUs, "CPUs each sandboxed provider plugin (and what it starts) may use, in its own cgroup (0: no limit)")
	fl.Int64Var(&f.pluginMemMB, "plugin-memory-mb", sandbox.DefaultPluginLimits.MemoryBytes>>20, "memory limit in MiB of each sandboxed provider plugin's cgroup (0: no limit)")
	fl.IntVar(&f.pluginLimits.PidsMax, "plugin-pids-max", sandbox.DefaultPluginLimits.PidsMax, "processes and threads limit of each sandboxed provider plugin's cgroup (0: no limit)")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", logfmt.Text, logfmt.Usage+" (passed to the terraformer kloud starts)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "serve https and wss only, with this PEM certificate (chain): plain http is refused, answers carry Strict-Transport-Security, cookies are Secure, --public-url defaults to https; the terraformer kloud starts serves with it too (needs --tls-key)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "the PEM private key of --tls-cert")
	fl.DurationVar(&f.o.JobLease, "job-lease", kloud.DefaultJobLease, "how long a crashed kloud's jobs stay claimed before they are resumed")
	fl.DurationVar(&f.o.ReconcileInterval, "reconcile-interval", kloud.DefaultReconcileInterval, "how often stacks and machines left in a transition by a job that is over are moved to Failed/Unknown")
	fl.DurationVar(&f.o.Retention.Jobs, "retention-jobs", kloud.DefaultRetentionJobs, "delete finished jobs (their logs and progress) this long after they finished; the newest job of a stack, machine or credential that exists stays")
	fl.DurationVar(&f.o.Retention.Kites, "retention-kites", kloud.DefaultRetentionKites, "delete presence records of kites whose kloud stopped refreshing them for this long (at least twice --retention-interval)")
	f.o.Retention.Audit = kloud.DefaultRetentionAudit
	fl.Var(daysFlag{&f.o.Retention.Audit}, "audit-retention", "delete audit log entries this old: 365d, 720h (the newest stays; kloud audit verify checks the kept chain)")
	fl.DurationVar(&f.o.Retention.Interval, "retention-interval", kloud.DefaultRetentionInterval, "how often kloud prunes finished jobs, expired revocations and stale kite records from its store")
	fl.Var(snapshotQuotaFlag{&f.o.SnapshotQuota}, "snapshot-quota", snapshotQuotaUsage) // snapshot.go
	gcServeFlags(fl, &f.o.GC)                                                           // gc.go
	fl.IntVar(&f.o.Limits.MaxMachinesPerStack, "max-machines-per-stack", kloud.DefaultMaxMachinesPerStack, fmt.Sprintf("cap on the machines of one stack, checked before terraform runs and on its plan (a template's own cap, kloud template update --max-machines, replaces it; at most %d)", kloud.MaxMachinesCeiling))
	fl.DurationVar(&f.o.Limits.PlanTimeout, "plan-timeout", kloud.DefaultPlanTimeout, "wall-time limit of a terraform plan made for a call (stack plan, create, update, scale): then it is cancelled and terraform killed")
	fl.StringVar(&f.o.MetricsAddr, "metrics-addr", "", "also serve GET /metrics (Prometheus) without authentication on this address, e.g. 10.0.0.5:9100 on a private network (on --addr it is for kloud administrators only)")
	fl.StringVar(&f.tfMetricsAddr, "terraformer-metrics-addr", "", "pass --metrics-addr to the terraformer it starts: its GET /metrics without authentication on this address")
	fl.DurationVar(&f.o.MetricsInterval, "metrics-interval", kloud.DefaultMetricsInterval, "how often the machines' cpu, memory and disk (from their klient) and the quota use are polled for /metrics")
	fl.Float64Var(&f.o.Limits.RateLimit, "rate-limit", kloud.DefaultRateLimit, "kloud calls a second each user may make on average; over it a call is refused with \"rate limited: retry in Ns\" (0: no limit)")
	fl.IntVar(&f.o.Limits.RateBurst, "rate-burst", kloud.DefaultRateBurst, "kloud calls each user may make at once before --rate-limit applies")
	// kloud/idle.go: off by default (Koding stopped idle machines after 50m)
	fl.DurationVar(&f.o.Idle.Timeout, "idle-timeout", 0, "stop a Running machine after this long without activity, unless its template or the machine says otherwise (0: never; Koding used 50m)")
	fl.DurationVar(&f.o.Idle.Warning, "idle-warning", kloud.DefaultIdleWarning, "warn a machine's attached terminals this long before its idle stop (at most half its timeout)")
	fl.Float64Var(&f.o.Idle.CPUThreshold, "idle-cpu-threshold", kloud.DefaultIdleCPUThreshold, "share of one CPU the processes of a machine's terminal sessions must use, as its agent reports, to count as activity (negative: CPU never counts)")
	fl.Var(defaultQuotaFlag{&f.o.DefaultQuota}, "default-quota", "quota of every user an administrator gave none (quota.go): machines=N,cores=N,memory=SIZE,disk=SIZE (SIZE: MB or 8G; limits not given: none)")
	f.sso.flags(cmd, &f.o.SSO)
	f.demo.flags(cmd)
	f.dummy.flags(cmd)
	f.local.flags(cmd)
	f.docker.flags(cmd)
	f.vagrant.flags(cmd)
	f.s3.flags(cmd)
	return cmd
}

func runServe(cmd *cobra.Command, g *globals, f *serveFlags) error {
	ctx := cmd.Context()
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log, err := logfmt.New(g.stderr, f.logFormat, lvl)
	if err != nil {
		return err
	}
	f.o.DataDir, f.o.Logger = g.dataDir, log
	for _, p := range f.trustedProxies {
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			a, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return fmt.Errorf("--trusted-proxy %q: want an address or a CIDR: %w", p, err)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		f.o.Browser.TrustedProxies = append(f.o.Browser.TrustedProxies, pfx)
	}
	if err := f.o.Browser.Validate(); err != nil { // before anything starts (the S3 server)
		return err
	}
	if err := f.sso.apply(&f.o.SSO); err != nil {
		return err
	}
	if f.o.TLS, err = tlsconf.Server(f.tlsCert, f.tlsKey); err != nil {
		return err
	}
	if f.o.CACert, err = tlsconf.ReadCA(g.caCert); err != nil {
		return err
	}
	clientTLS, err := g.tlsConfig()
	if err != nil {
		return err
	}
	f.o.PeerTLS = clientTLS.Clone() // what links to other replicas trust (kloud/mesh.go)
	if f.pluginLimits.CPUs < 0 || f.pluginMemMB < 0 || f.pluginLimits.PidsMax < 0 {
		return errors.New("--plugin-cpus, --plugin-memory-mb and --plugin-pids-max must not be negative")
	}
	if f.pluginLimits.MemoryBytes = f.pluginMemMB << 20; f.pluginLimits != (cgroups.Limits{}) {
		f.o.Plugins.Limits = &f.pluginLimits
	}
	reg := provider.NewRegistry()
	f.dummy.register(reg, f.o.CACert, log)
	if err := f.local.register(ctx, f, reg, log); err != nil {
		return err
	}
	if err := f.docker.register(ctx, f, reg, log); err != nil {
		return err
	}
	if err := f.vagrant.register(f, reg, log); err != nil {
		return err
	}
	// The S3 server once the local provider's bridge is up: its S3 gateway listens where kloud
	// does, which may be that bridge's address.
	if err := f.s3.start(ctx, f, log, glogFilter{prefixWriter{g.stderr, "weed: "}}); err != nil {
		return err
	}
	defer f.s3.stop()
	f.local.setBuckets(f, log)
	for _, n := range reg.Names() {
		p, _ := reg.Lookup(n)
		if p.Available != nil {
			if err := p.Available(); err != nil {
				fmt.Fprintf(g.stderr, "provider %s is unavailable on this host: %v\n", n, err)
			}
		}
	}
	f.o.Providers = reg
	f.o.Doctor = serveDoctorChecks(f) // doctor.go
	var s *kloud.Server
	listening := make(chan struct{})
	f.o.Listening = func(a net.Addr) {
		close(listening)
		fmt.Fprintf(g.stdout, "kloud %s listening on %s\n", version.Version, a)
		fmt.Fprintf(g.stdout, "admin key: %s\n", s.AdminKeyPath())
		fmt.Fprintf(g.stdout, "providers: %s\n", strings.Join(reg.Names(), ", "))
		fmt.Fprintf(g.stdout, "provider plugins: %s\n", s.PluginDir())
		if f.o.MetricsAddr != "" {
			fmt.Fprintf(g.stdout, "metrics: http://%s/metrics (unauthenticated)\n", f.o.MetricsAddr)
		}
		if n := f.vagrant.hostNote(f.o.DataDir); n != "" {
			fmt.Fprintln(g.stderr, n)
		}
		for _, w := range reachWarnings(ctx, a, s.PublicURL(), reg) {
			fmt.Fprintf(g.stderr, "warning: %s\n", w)
		}
	}
	s, err = openServer(ctx, f.o, log)
	if err != nil {
		return err
	}
	web.Register(s)
	f.demo.start(ctx, s, log)
	f.local.start(ctx, s, log)
	f.docker.start(ctx, s, log)
	f.vagrant.start(ctx, s, log)
	key, err := kitekey.ReadFile(s.KloudKeyPath())
	if err != nil {
		s.Close()
		return err
	}
	if len(f.terraformerURLs) == 0 && f.o.TLS != nil {
		// The terraformer kloud starts serves kloud's certificate on loopback: check the name
		// kloud is reached by.
		clientTLS.ServerName = hostOf(s.PublicURL())
	}
	ck, err := kite.New(kite.Options{Identity: kite.Identity{Name: "kloud", Username: "kloud", Version: version.Version}, Logger: log, TLSConfig: clientTLS})
	if err != nil {
		s.Close()
		return err
	}
	// Terraformer first (it needs kloud's keys only when kloud first calls it), so kloud never
	// serves a moment without it; the ones kloud starts are supervised (restarted when they exit).
	tfURLs := f.terraformerURLs
	var sups []*supervise.Process
	if len(tfURLs) == 0 {
		if f.terraformers < 1 {
			s.Close()
			return fmt.Errorf("--terraformers %d: want at least 1", f.terraformers)
		}
		addrs := strings.Split(f.terraformerAddr, ",")
		for i := range f.terraformers {
			addr := ""
			if i < len(addrs) {
				addr = strings.TrimSpace(addrs[i])
			}
			sup, err := newTerraformerSupervisor(g, f, log, i, addr)
			if err != nil {
				s.Close()
				return err
			}
			sups = append(sups, sup)
			tfURLs = append(tfURLs, sup.URL)
		}
	} else if f.terraformers != 1 {
		s.Close()
		return errors.New("--terraformers starts terraformers, --terraformer-url uses running ones: give one of them")
	}
	var clients []*tfclient.Client
	for _, u := range tfURLs {
		clients = append(clients, tfclient.NewClient(ck, u, func(ctx context.Context) (kite.Auth, error) {
			// terraformer verifies kloud's key with kloud's /kite/keys: connecting before kloud
			// listens would fail, and make terraformer wait before it fetches the keys again.
			select {
			case <-listening:
			case <-ctx.Done():
				return kite.Auth{}, fmt.Errorf("kloud is not listening yet: %w", ctx.Err())
			}
			return kite.Auth{Type: kite.AuthKiteKey, Key: key}, nil
		}))
	}
	var tc kloud.Terraformer = clients[0]
	if len(clients) > 1 {
		pool, err := tfpool.New(tfpool.Options{Members: clients, Logger: log.With("component", "tfpool")})
		if err != nil {
			s.Close()
			return err
		}
		defer pool.Close()
		tc = pool
	} else {
		defer clients[0].Close()
	}
	for i, sup := range sups {
		sup.OnDown, sup.OnUp = clients[i].SetUnavailable, clients[i].SetAvailable
		if err := sup.Start(ctx); err != nil {
			s.Close()
			return err
		}
		defer sup.Stop()
		log.Info("terraformer started", "url", sup.URL, "pid", sup.PID())
	}
	s.SetTerraformer(tc)
	for _, u := range tfURLs {
		fmt.Fprintf(g.stdout, "terraformer: %s\n", u)
	}
	return s.Serve(ctx)
}

// storeWaitInterval is how long kloud serve waits between attempts to reach its store at start.
const storeWaitInterval = 2 * time.Second

// openServer is kloud.New, which opens the store. While the store does not answer (a
// --mongo-url database that is down or unreachable; each attempt gives up after the store's
// server-selection timeout) it logs "waiting for the store at URL (cause)" and tries again every
// few seconds until ctx ends. Any other error ends it at once.
func openServer(ctx context.Context, o kloud.Options, log *slog.Logger) (*kloud.Server, error) {
	for {
		s, err := kloud.New(ctx, o)
		if err == nil || o.MongoURL == "" || !store.IsUnavailable(err) {
			return s, err
		}
		log.Warn(fmt.Sprintf("waiting for the store at %s (%v)", redactURL(o.MongoURL), err))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the store at %s: %w (last: %w)", redactURL(o.MongoURL), ctx.Err(), err)
		case <-time.After(storeWaitInterval):
		}
	}
}

// redactURL is u with its password replaced by "xxxxx". A URL Go's parser refuses (a unix
// socket's escaped path as host) loses its whole user info instead.
func redactURL(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return "(unparsable URL)"
	}
	host, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(host, "@"); i >= 0 {
		host = "xxxxx@" + host[i+1:]
	}
	if path != "" || strings.Contains(rest, "/") {
		host += "/" + path
	}
	return scheme + "://" + host
}

// newTerraformerSupervisor prepares the terraformer next to kloud (trusting this kloud's keys)
// and its supervisor; Start runs it and returns once it answers /healthz. When it exits it is
// started again after a backoff (internal/supervise); while it is down, OnDown (kloud's
// terraformer client's SetUnavailable) makes calls fail at once with "terraformer unavailable:
// <cause>". When kloud dies, even by SIGKILL, terraformer gets SIGTERM (Pdeathsig), cancels its
// runs and exits; the terraform it runs dies with it (the sandbox launcher's pid namespace).
//
// With --terraformers N > 1, terraformer i (from 0) keeps its kite id in <data dir>/terraformer-i
// and the stacks and jobs of all N in <data dir>/terraformer (--shared-dir): where the one
// terraformer of a single kloud keeps them, so its stacks are the pool's as they are.
func newTerraformerSupervisor(g *globals, f *serveFlags, log *slog.Logger, i int, addrFlag string) (*supervise.Process, error) {
	bin := f.terraformerBin
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		bin = filepath.Join(filepath.Dir(exe), "terraformer")
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("no terraformer to start at %s (build it with `make build`, or pass --terraformer-url): %w", bin, err)
	}
	_, port, _ := net.SplitHostPort(f.o.Addr)
	kloudURL, scheme := f.o.PublicURL, "http"
	if f.o.TLS != nil {
		scheme = "https"
	}
	if kloudURL == "" {
		kloudURL = scheme + "://127.0.0.1:" + port
	}
	var addr string
	var err error
	if i == 0 || addrFlag != "" {
		addr, err = terraformerAddr(addrFlag)
	} else {
		addr, err = freeLoopback()
	}
	if err != nil {
		return nil, err
	}
	shared := filepath.Join(g.dataDir, "terraformer")
	args := []string{"--addr", addr, "--data-dir", shared, "--kloud-url", kloudURL, "--log-format", f.logFormat}
	name := "terraformer"
	if f.terraformers > 1 {
		name = fmt.Sprintf("terraformer-%d", i)
		args[3] = filepath.Join(g.dataDir, name)
		args = append(args, "--shared-dir", shared)
	}
	if cfg := tfCLIConfig(); cfg != "" {
		args = append(args, "--cli-config", cfg)
	}
	args = append(args, "--terraform-cpus", strconv.FormatFloat(f.tfLimits.CPUs, 'g', -1, 64),
		"--terraform-memory-mb", strconv.FormatInt(f.tfMemMB, 10), "--terraform-pids-max", strconv.Itoa(f.tfLimits.PidsMax))
	if f.tfMetricsAddr != "" && i == 0 {
		args = append(args, "--metrics-addr", f.tfMetricsAddr)
	}
	if f.tfInsecure {
		log.Warn("terraformer runs terraform without its sandbox (--terraformer-insecure-no-sandbox): templates run with this process's privileges")
		args = append(args, "--insecure-no-sandbox")
	}
	var hc *http.Client
	if f.o.TLS != nil {
		args = append(args, "--tls-cert", f.tlsCert, "--tls-key", f.tlsKey)
		if g.caCert != "" {
			args = append(args, "--ca-cert", g.caCert)
		}
		cfg, err := g.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.ServerName = hostOf(kloudURL)
		hc = tlsconf.HTTPClient(cfg, 0)
	}
	return &supervise.Process{Name: name, Bin: bin, Args: args, URL: scheme + "://" + addr, HTTP: hc, Out: prefixWriter{g.stderr, name + ": "}, Log: log}, nil
}

// terraformerAddr returns where to start terraformer: the flag's address, else 127.0.0.1:7001,
// else (that port is taken) a free loopback port. The flag's address may still be held by the
// terraformer of a kloud that was just killed (it stops on its Pdeathsig, which takes a moment):
// it waits up to terraformerAddrWait for it to be free (chaos: a kloud restarted at once failed
// to start, "bind: address already in use").
func terraformerAddr(flag string) (string, error) {
	if flag != "" {
		waitFree(flag, terraformerAddrWait)
		return flag, nil
	}
	if ln, err := net.Listen("tcp", "127.0.0.1:7001"); err == nil {
		ln.Close()
		return "127.0.0.1:7001", nil
	}
	return freeLoopback()
}

// terraformerAddrWait bounds terraformerAddr's wait for the flag's address to be free.
const terraformerAddrWait = 30 * time.Second

// waitFree waits until addr can be listened on, or another error than "in use" says it never
// will here, or wait passes (the start then fails with the listener's own error).
func waitFree(addr string, wait time.Duration) {
	for deadline := time.Now().Add(wait); ; time.Sleep(100 * time.Millisecond) {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
			return
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return
		}
	}
}

// freeLoopback returns a loopback address with a port free now.
func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// tfCLIConfig returns the Terraform CLI config terraformer should use when the environment's
// does not exist: the offline mirror's config that scripts/setup.sh wrote.
func tfCLIConfig() string {
	if env := os.Getenv("TF_CLI_CONFIG_FILE"); env != "" {
		if _, err := os.Stat(env); err == nil {
			return ""
		}
	}
	cache := os.Getenv("KLOUD_CACHE")
	if cache == "" {
		cache = "/var/cache/kloud"
	}
	p := filepath.Join(cache, "terraform.tfrc")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

// hostOf is the host name (no port) of URL u ("" if it does not parse).
func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Hostname()
}

// prefixWriter prefixes every line written through it.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			io.WriteString(p.w, p.prefix+line)
		}
	}
	return len(b), nil
}
