// Package kloudtest starts a real kloud in-process for tests: its store on the test process's
// shared store server (or embedded, in a temp dir), kontrol, the RPC methods, on a loopback
// HTTP server; and gives tests connected clients as any user: typed ones (Env.Client, an
// api.Client, as coderdtest gives a codersdk.Client) or the kite connection itself (Env.Dial)
// for what the typed client does not cover.
package kloudtest

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudhttp"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
	"github.com/kloud-dev/kloud/provider"
)

// Options tune the test kloud.
type Options struct {
	Providers   *provider.Registry // default: an empty registry
	Terraformer kloud.Terraformer  // optional
	KlientBin   string             // optional: binary served at /dl/klient
	DataDir     string             // default: a temp dir (pass one to restart on the same data)
	// Addr to listen on (default 127.0.0.1:0).
	Addr string
	// Logger receives kloud's log (default: the test's log).
	Logger *slog.Logger
	// Retention is kloud's (zero: its defaults).
	Retention kloud.Retention
	// AgentTimeout is kloud's wait for a machine's agent (zero: kloud.DefaultAgentTimeout).
	AgentTimeout time.Duration
	// PluginDir holds provider plugins (kloud-provider-NAME) kloud launches (default
	// <DataDir>/plugins); Plugins configure the launcher. A test that launches plugins needs a
	// TestMain calling tfsandbox.MaybeRun (the test binary is the sandbox's launcher).
	PluginDir string
	Plugins   kloud.PluginOptions
	// SnapshotQuota is kloud's (zero: its defaults).
	SnapshotQuota kloud.SnapshotQuota
	// DefaultQuota is kloud's quota of users without one (zero: no limit).
	DefaultQuota api.Quota
	// GC configures kloud's garbage collector (zero: no periodic sweep, kloud's default grace;
	// gc.run works).
	GC kloud.GCOptions
	// Limits are kloud's caps (zero fields: its defaults).
	Limits kloud.Limits
	// MongoURL: use this database instead of the shared store server (e.g. a
	// storetest.Server that a test stops and starts).
	MongoURL string
	// MongoDatabase is the database on MongoURL (default "kloud"); several replicas of one
	// test share it (storetest.Serve), each with the same secret key in its DataDir.
	MongoDatabase string
	// PublicURL is kloud's public URL (default its own http://127.0.0.1:port); a test of
	// several replicas gives them one, as a load balancer's. The internal URL (the replicas'
	// way to each other, kloud/mesh.go) is always the replica's own address.
	PublicURL string
	// ReplicaHeartbeat is kloud's (zero: its default).
	ReplicaHeartbeat time.Duration
	// Replicas and EventLog are kloud's (several replicas sharing MongoURL: the change log of
	// events and kite registrations, kloud/eventlog.go).
	Replicas bool
	EventLog kloud.EventLogOptions
	// EmbeddedStore runs kloud's embedded store in DataDir/db, in this process, as kloud serve
	// does, for a test of what only it does (its files, its snapshot, its lock). Default (and
	// without MongoURL): a database of kloud's own, named after DataDir, on the test process's
	// shared store server (storetest.Shared), the same FerretDB out of the race-built test
	// binary.
	EmbeddedStore bool
	// MetricsAddr and MetricsInterval are kloud's (zero: no metrics listener; the default
	// interval).
	MetricsAddr     string
	MetricsInterval time.Duration
	// SSO is kloud's single sign-on (zero: off; internal/oidctest starts a real provider).
	SSO kloud.SSOOptions
	// Idle configures kloud's idle stop (zero: its defaults).
	Idle kloud.IdleOptions
	// Browser: origins, cookies and trusted proxies (kloud.Options.Browser).
	Browser kloudhttp.Browser
}

// ClientCallTimeout bounds the calls of the test clients (Dial, Client) whose ctx has no
// deadline, instead of kite's 30 s: the package's tests run in parallel under -race beside other
// packages, and on a loaded 2-core machine a stack.create (a terraform plan) took longer. A test
// that wants a caller's deadline gives its ctx one.
const ClientCallTimeout = 3 * time.Minute

// heartbeatTimeout is how long kloud waits for a kite's pong (its ping goes every 2 s): a peer
// that dies closes its socket and is gone at once, so this only bounds a peer that hangs. 2 s
// dropped the test's own connections on a host loaded thirty times over (CI: "peer did not
// answer ping within 2s", then "kite: connection closed" in the middle of a test).
const heartbeatTimeout = 20 * time.Second

// Env is a running test kloud.
type Env struct {
	t       testing.TB
	dataDir string
	Server  *kloud.Server
	URL     string // http://127.0.0.1:port
	Addr    string
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start starts kloud and stops it when the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	if o.Providers == nil {
		o.Providers = provider.NewRegistry()
	}
	if o.GC == (kloud.GCOptions{}) {
		o.GC.Interval = -1 // tests call gc.run
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.Logger == nil {
		o.Logger = testutil.Logger(t)
	}
	database := o.MongoDatabase
	if o.MongoURL == "" && !o.EmbeddedStore {
		o.MongoURL, database = storetest.Shared(t, o.DataDir)
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	url := "http://" + addr
	public := url
	if o.PublicURL != "" {
		public = o.PublicURL
	}
	s, err := kloud.New(t.Context(), kloud.Options{
		DataDir: o.DataDir, Addr: addr, PublicURL: public, InternalURL: url, ReplicaHeartbeat: o.ReplicaHeartbeat, Providers: o.Providers, Terraformer: o.Terraformer,
		KlientBin: o.KlientBin, Logger: o.Logger, Retention: o.Retention, AgentTimeout: o.AgentTimeout,
		PluginDir: o.PluginDir, Plugins: o.Plugins, SnapshotQuota: o.SnapshotQuota, GC: o.GC, Limits: o.Limits, MongoURL: o.MongoURL, MongoDatabase: database,
		HeartbeatInterval: 2 * time.Second, HeartbeatTimeout: heartbeatTimeout,
		DefaultQuota: o.DefaultQuota, MetricsAddr: o.MetricsAddr, MetricsInterval: o.MetricsInterval,
		SSO: o.SSO, Idle: o.Idle, Browser: o.Browser, Replicas: o.Replicas, EventLog: o.EventLog,
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Env{t: t, dataDir: o.DataDir, Server: s, URL: url, Addr: addr, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		s.ServeListener(ctx, ln)
	}()
	t.Cleanup(e.Stop)
	return e
}

// Stop stops the server (idempotent).
func (e *Env) Stop() {
	e.cancel()
	<-e.done
	e.Server.WaitJobs()
}

// Dial connects as username with a fresh kite key for that user.
func (e *Env) Dial(username string) *kite.Conn {
	e.t.Helper()
	key, _, err := e.Server.Kontrol.CreateKey(username, "")
	if err != nil {
		e.t.Fatal(err)
	}
	return e.DialAuth(kite.Auth{Type: kite.AuthKiteKey, Key: key})
}

// DialAuth connects with the given credential.
func (e *Env) DialAuth(a kite.Auth) *kite.Conn {
	e.t.Helper()
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "test-client"}, Logger: testutil.Logger(e.t), CallTimeout: ClientCallTimeout})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { k.Close() })
	c, err := k.Dial(e.t.Context(), e.URL+"/kite", a)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// Client connects as username (a fresh kite key for that user) and returns the typed client.
func (e *Env) Client(username string) *api.Client { return api.NewClient(e.Dial(username)) }

// ClientAuth connects with the given credential and returns the typed client.
func (e *Env) ClientAuth(a kite.Auth) *api.Client { return api.NewClient(e.DialAuth(a)) }

// Call makes a call on c and fails the test on error.
func Call(t testing.TB, c *kite.Conn, method string, params, result any) {
	t.Helper()
	if err := c.Call(t.Context(), method, params, result); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
}
