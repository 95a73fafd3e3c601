// Package plugin runs a provider out of kloud's process: a provider plugin is a binary
// kloud-provider-NAME whose main is
//
//	func main() { plugin.Serve(myprovider.Provider) }
//
// with exactly the *provider.Provider value an in-tree provider registers. Nothing in the
// provider's own code knows whether it runs in kloud or in a plugin.
//
// # For plugin authors
//
// Write the provider against package provider (Schema, Stack, Machine; see its doc and
// examples/provider-example), then call Serve from main. Serve reads what it needs to reach kloud
// from the environment — EnvURL (kloud's kite URL) and EnvKey or EnvKeyFile (a plugin key) — or
// from -url and -key-file, and serves until SIGTERM. Kloud sets the environment when it launches
// a plugin from its plugin directory; for a plugin you run yourself ("remote", e.g. on the host
// next to a hypervisor), mint a key with `kloud key create --provider NAME`. -manifest prints what
// the plugin will register. Run is Serve for programs and tests: it takes a ctx and Options.
//
// What your provider gets is what an in-tree provider gets, rebuilt in the plugin for every call:
//
//   - Credential.Value and .Bootstrap decoded into your Schema's types (provider.Decode).
//   - BaseStack with the stack's template, its machines of your provider, and an AgentConfig
//     that returns each machine's agent configuration (kloud mints the machines' agent keys and
//     sends only those: a plugin never holds kloud's signing keys, another provider's
//     credentials, or a user's session). provider.BaseStack.InjectUserData works unchanged.
//   - BaseMachine with the machine's attributes, metadata and credential.
//   - Requests to provider.HandlerPrefix(NAME) on kloud's HTTP server, forwarded to your
//     Provider.Handler (bodies of at most MaxHTTPBody; no streaming).
//
// Optional interfaces (ConsoleLogger, Resizer, ConstraintsValidator, Snapshotter: snapshot.go,
// TemplateValidator: templaterules.go) are found as in process and advertised as capabilities (Provider.Capabilities, or derived).
// So are Provider.Inventory (capability "resources": resources.go) and Provider.Buckets
// (capability "bucket", object buckets for stacks' bucket claims: bucket.go).
// Return (wrapped) provider.ErrUnsupported for an operation you do not offer. Logs go to stderr,
// which kloud copies into its log for plugins it launched. A launched plugin may write only
// EnvStateDir.
//
// # The wire
//
// The plugin dials kloud's kite endpoint (the one users use) with its plugin key (kind
// pluginKey, kite/kitekey) and calls MethodRegister (plugin.register) with RegisterParams: the
// plugin API versions it speaks (Version), its own version and its Manifest (name, resource
// type, capabilities, schemas and field lists). Kloud picks a version both speak or refuses with
// an error naming both lists. Kloud then calls the plugin back on that same connection
// (provider.verifyCredential, provider.applyTemplate, machine.start, ...: the Method*
// constants), with BaseStack/BaseMachine/Credential in JSON (wire.go). A plugin key can call
// nothing on kloud but plugin.register. A lost connection is dialed and registered again with
// backoff; Run gives up only on a refusal retrying cannot cure (a rejected key, a name kloud
// has built in, a version mismatch).
//
// # Kloud's side
//
// Host keeps the plugins: Host.Register is the body of kloud's plugin.register route; it puts a
// proxy *provider.Provider for the plugin into kloud's provider.Registry (Registry.Replace), so
// kloud's code uses a plugin like an in-tree provider. The proxy's Stack and Machine call the
// plugin; its machine always implements ConsoleLogger, Resizer and Snapshotter and its stack
// ConstraintsValidator and TemplateValidator, returning provider.ErrUnsupported unless the plugin advertised the
// capability (Provider.Capabilities is set from the manifest); its Inventory and Buckets are set
// only if the plugin advertised "resources" and "bucket". One connection per provider
// name: a newer registration replaces (closes) the older. While a plugin is disconnected its
// proxy stays registered; a call waits for the plugin to connect again (a killed plugin is
// restarted by kloud within seconds, a remote one redials), for up to HostOptions.RestartWait
// (1m) after it went down; past that bound every call fails at once with an error wrapping
// kite.ErrUnavailable ("provider NAME (plugin) is not connected: <last error> (down for over
// 1m0s)"). A call in flight when the connection drops fails at once ("disconnected during"): it
// may have done its work, so it is not repeated. Host.Status is what `kloud provider list` shows.
//
// Start reading at Serve and Run (serve.go) for the plugin side, Host.Register (host.go) and
// newProxy (proxy.go) for kloud's.
package plugin
