// Package pluginhost is kloud's host of out-of-process provider plugins (provider/plugin): the
// launcher that starts, sandboxes (internal/sandbox) and supervises the plugins of the plugin
// directory, and what kloud's plugin routes answer (plugin.register, provider.list,
// provider.keyCreate, the providers' HTTP services under /provider/). The proxies a registered
// plugin gets in the provider registry, their connections and status are provider/plugin's Host,
// which this package owns one of.
//
// Start with New and Options (what it gets of kloud: the provider registry, a minter of plugin
// keys, a logger; never kloud's Server), then Host.Run (launcher.go: the plugin directory, the
// sandbox, restarts) and the route answers below. kloud (kloud/plugins.go) builds one in New,
// gives it its kite URL when it listens, runs Run as a background task and keeps thin handlers.
package pluginhost

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// KeyMinter mints plugin keys: kloud's kontrol (kontrol.Kontrol.CreatePluginKey).
type KeyMinter interface {
	CreatePluginKey(spec kitekey.PluginKeySpec) (key, kiteID string, err error)
}

// Options configure New.
type Options struct {
	// Registry is kloud's provider registry (required): the in-tree providers are in it, and
	// every plugin that registers gets a proxy Replace'd into it under its name.
	Registry *provider.Registry
	// Keys mints the plugin keys of launched plugins and of provider.keyCreate (required).
	Keys KeyMinter
	// Dir holds the plugin binaries the launcher runs, kloud-provider-NAME (required unless
	// Launch.NoLaunch).
	Dir string
	// StateDir holds each launched plugin's own directory, StateDir/NAME (required unless
	// Launch.NoLaunch; kloud: <data dir>/plugin-state).
	StateDir string
	// Launch configures the launcher (zero fields: the defaults of LaunchOptions).
	Launch LaunchOptions
	// TLS says kloud serves wss only: a launched plugin then gets CACert (PEM; may be empty:
	// the system's roots) and the host name of PublicURL to check kloud's certificate with.
	TLS       bool
	CACert    string
	PublicURL string
	// Peers reaches the plugins connected to other kloud replicas (kloud's mesh); nil: none.
	Peers plugin.Peers
	// KloudVersion is the version plugins are told at registration.
	KloudVersion string
	// Logger (nil: discard).
	Logger *slog.Logger
}

// Host hosts kloud's provider plugins. Its methods are safe for concurrent use.
type Host struct {
	o       Options
	log     *slog.Logger
	plugins *plugin.Host
	done    chan struct{} // closed when Run returns

	mu      sync.Mutex
	kiteURL string    // kloud's kite endpoint on loopback (SetKiteURL)
	l       *launcher // set by Run
	ran     bool      // Run was called
}

// New returns a plugin host. Nothing is launched before Run.
func New(o Options) (*Host, error) {
	if o.Registry == nil {
		return nil, errors.New("pluginhost: Options.Registry is required")
	}
	if o.Keys == nil {
		return nil, errors.New("pluginhost: Options.Keys is required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	o.Launch.defaults()
	return &Host{
		o: o, log: o.Logger, done: make(chan struct{}),
		plugins: plugin.NewHost(plugin.HostOptions{Registry: o.Registry, Logger: o.Logger, KloudVersion: o.KloudVersion, Peers: o.Peers}),
	}, nil
}

// Plugins returns the host of the registered plugins (their proxies and status).
func (h *Host) Plugins() *plugin.Host { return h.plugins }

// Dir is the directory of the plugins this host launches.
func (h *Host) Dir() string { return h.o.Dir }

// PID returns the pid of the launcher process of the running plugin name (the sandbox's
// launcher, or the plugin itself when it runs unsandboxed), 0 if none runs.
func (h *Host) PID(name string) int {
	h.mu.Lock()
	l := h.l
	h.mu.Unlock()
	if l == nil {
		return 0
	}
	return l.pid(name)
}

// SetKiteURL sets kloud's kite endpoint on loopback that launched plugins dial
// (LoopbackKiteURL); call it before Run.
func (h *Host) SetKiteURL(u string) {
	h.mu.Lock()
	h.kiteURL = u
	h.mu.Unlock()
}

// Done is closed once Run returned (every launched plugin stopped).
func (h *Host) Done() <-chan struct{} { return h.done }

// LoopbackKiteURL is kloud's kite endpoint on loopback for a server listening on addr.
func LoopbackKiteURL(addr net.Addr, tls bool) string {
	scheme := "ws://"
	if tls {
		scheme = "wss://"
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return scheme + addr.String() + "/kite"
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return scheme + net.JoinHostPort(host, port) + "/kite"
}

// publicHost is the host name (without port) of a URL.
func publicHost(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Hostname()
}

func randomHex(n int) string {
	b := make([]byte, n)
	crand.Read(b)
	return hex.EncodeToString(b)
}

// IsBuiltin reports whether name is an in-tree provider: in the registry, and not a plugin the
// host knows (a proxy is Replace'd into the registry under its plugin's name).
func (h *Host) IsBuiltin(name string) bool {
	if _, err := h.o.Registry.Lookup(name); err != nil {
		return false
	}
	for _, st := range h.plugins.Status() {
		if st.Name == name {
			return false
		}
	}
	return true
}

// Register answers plugin.register: plugin keys only (users are refused), for the provider
// their key names; the plugin host checks the version and manifest and installs the proxy.
func (h *Host) Register(ctx context.Context, r *kite.Request, p *api.PluginRegisterParams) (*plugin.RegisterResult, error) {
	if !kitekey.IsPlugin(r.Principal()) {
		return nil, fmt.Errorf("%s is for provider plugins (plugin keys: `kloud key create --provider NAME`): %w", r.Method, kite.ErrPermission)
	}
	if h.IsBuiltin(p.Provider.Name) {
		return nil, fmt.Errorf("provider %q is built into kloud: a plugin cannot replace it: %w", p.Provider.Name, kite.ErrConflict)
	}
	rp := plugin.RegisterParams(*p)
	res, err := h.plugins.Register(ctx, r, &rp)
	if err != nil && errors.Is(err, kite.ErrInvalidParams) && p.Provider.Name == kitekey.PluginName(r.Principal()) {
		// Refused for what it is (an API version kloud does not speak, an invalid manifest):
		// provider.list shows why, also for a remote plugin that no supervisor watches.
		h.plugins.SetError(p.Provider.Name, err)
		h.log.ErrorContext(ctx, "provider plugin refused", "provider", p.Provider.Name, "err", err)
	}
	return res, err
}

// List answers provider.list: every provider, in-tree and plugin. A plugin's whereabouts and
// last output are for administrators (admin).
func (h *Host) List(admin bool) api.ProviderListResult {
	out := api.ProviderListResult{Providers: []api.ProviderStatus{}}
	plugins := map[string]plugin.Status{}
	for _, st := range h.plugins.Status() {
		plugins[st.Name] = st
	}
	names := h.o.Registry.Names()
	for n := range plugins {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if st, ok := plugins[n]; ok {
			ps := api.ProviderStatus{
				Name: n, Kind: api.ProviderPlugin, Version: st.Version, APIVersion: st.APIVersion, Where: st.Where,
				Connected: st.Connected, LastError: st.LastError, Capabilities: capStrings(st.Capabilities),
			}
			if st.Replica != "" {
				ps.Replica, ps.Where = st.Replica, st.Where+" (connected to replica "+st.Replica+")"
			}
			if !st.ConnectedAt.IsZero() {
				ps.ConnectedAt = new(st.ConnectedAt)
			}
			if !st.DisconnectedAt.IsZero() {
				ps.DisconnectedAt = new(st.DisconnectedAt)
			}
			if !admin {
				// Where (pids, addresses) and the plugin's last output lines are for
				// administrators: a plugin's output is its own and may say anything.
				ps.Where, ps.Replica = "plugin", ""
				if ps.LastError != "" {
					ps.LastError = "the plugin failed (kloud administrators see why in `kloud provider list`)"
				}
			}
			out.Providers = append(out.Providers, ps)
			continue
		}
		p, err := h.o.Registry.Lookup(n)
		if err != nil {
			continue
		}
		ps := api.ProviderStatus{Name: n, Kind: api.ProviderBuiltin, Where: "in process", Connected: true, Capabilities: capStrings(p.Caps())}
		if p.Available != nil {
			if err := p.Available(); err != nil {
				ps.Connected, ps.LastError = false, "unavailable on this host: "+err.Error()
			}
		}
		out.Providers = append(out.Providers, ps)
	}
	return out
}

func capStrings[T ~string](cs []T) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, string(c))
	}
	return out
}

// CreateKey answers provider.keyCreate for a kloud administrator (by): the key a remote plugin
// dials kloud with (no expiry; revocable by its kite id with kontrol.revoke). Logged.
func (h *Host) CreateKey(ctx context.Context, p *api.ProviderKeyCreateParams, by string) (api.ProviderKeyCreateResult, error) {
	if h.IsBuiltin(p.Provider) {
		return api.ProviderKeyCreateResult{}, fmt.Errorf("provider %q is built into kloud: a plugin cannot use its name: %w", p.Provider, kite.ErrConflict)
	}
	id := p.KiteID
	if id == "" {
		id = kitekey.PluginIDPrefix + p.Provider + "." + randomHex(8)
	}
	key, id, err := h.o.Keys.CreatePluginKey(kitekey.PluginKeySpec{Provider: p.Provider, KiteID: id})
	if err != nil {
		return api.ProviderKeyCreateResult{}, err
	}
	h.log.WarnContext(ctx, "plugin key created", "provider", p.Provider, "kiteId", id, "by", by)
	return api.ProviderKeyCreateResult{Provider: p.Provider, KiteID: id, Key: key}, nil
}

// ServeProvider dispatches /provider/NAME/... to provider NAME's Handler, looked up per
// request: an in-tree provider's, or a plugin's proxy (which serves it over the plugin's
// connection), so a plugin that registers after kloud started is served too.
func (h *Host) ServeProvider(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/provider/")
	name, _, slash := strings.Cut(rest, "/")
	p, err := h.o.Registry.Lookup(name)
	if name == "" || err != nil || p.Handler == nil {
		http.NotFound(w, r)
		return
	}
	if !slash {
		http.Redirect(w, r, provider.HandlerPrefix(name), http.StatusMovedPermanently)
		return
	}
	// A provider's service is for its machines and its Terraform provider, never for browsers,
	// and it may be a plugin (third-party code): it gets no user's session cookie, and what it
	// answers cannot run as kloud's web UI (a sandboxed, script-less document of its own origin).
	r.Header.Del("Cookie")
	w.Header().Set("Content-Security-Policy", "sandbox; default-src 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	p.Handler.ServeHTTP(w, r)
}
