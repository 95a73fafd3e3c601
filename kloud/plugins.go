package kloud

// Provider plugins: kloud/pluginhost launches, sandboxes and supervises the plugin directory's
// plugins and answers the plugin routes; this file is the wiring and the thin handlers of
// plugin.register, provider.list and provider.keyCreate (routes.go).

import (
	"context"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/pluginhost"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// PluginPrefix starts the file name of every plugin binary: kloud-provider-NAME.
const PluginPrefix = pluginhost.Prefix

// PluginOptions configure the plugin launcher (kloud/pluginhost). Zero fields take its defaults.
type PluginOptions = pluginhost.LaunchOptions

// PluginHost returns the host of this kloud's provider plugins (their proxies and status).
func (s *Server) PluginHost() *plugin.Host { return s.plugins.Plugins() }

// PluginDir is the directory of the plugins this kloud launches.
func (s *Server) PluginDir() string { return s.plugins.Dir() }

// PluginPID returns the pid of the launcher process of the running plugin name (the sandbox's
// launcher, or the plugin itself when it runs unsandboxed), 0 if none runs.
func (s *Server) PluginPID(name string) int { return s.plugins.PID(name) }

// pluginAPI serves plugin.register, provider.list and provider.keyCreate (routes.go) from the
// plugin host.
type pluginAPI struct {
	host *pluginhost.Host
}

// register serves plugin.register: plugin keys only (the route's Gate refuses agents; users
// are refused by the host), for the provider their key names.
func (a *pluginAPI) register(ctx context.Context, r *kite.Request, p *api.PluginRegisterParams) (api.PluginRegisterResult, error) {
	return deref(a.host.Register(ctx, r, p))
}

// list serves provider.list: every provider, in-tree and plugin.
func (a *pluginAPI) list(ctx context.Context, c *Caller, _ *kite.Request, _ *api.NoParams) (api.ProviderListResult, error) {
	return a.host.List(c.Admin), nil
}

// mintKey serves provider.keyCreate: a kloud administrator mints the key a remote plugin dials
// kloud with.
func (a *pluginAPI) mintKey(ctx context.Context, c *Caller, _ *kite.Request, p *api.ProviderKeyCreateParams) (api.ProviderKeyCreateResult, error) {
	return a.host.CreateKey(ctx, p, c.Username)
}
