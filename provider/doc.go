// Package provider is the contract between kloud and the infrastructure providers, and the
// helpers providers share.
//
// Start with Provider and Registry: a provider is a value, registered (database/sql style, but
// in a Registry the caller builds and passes to kloud as kloud.Options.Providers: there is no
// global registry) with a Schema (its credential, bootstrap and metadata types), a Stack
// constructor (verify credentials, bootstrap templates, rewrite a stack's template before apply)
// and a Machine constructor (start, stop, info). Optional capabilities are separate interfaces
// (ConsoleLogger, Resizer, ...); each documents what kloud does when a provider lacks it. What a
// provider can do is its Caps (capability.go): derived from those interfaces, or set in
// Provider.Capabilities (a plugin's proxy; a provider advertising less); kloud asks Can, never a
// type assertion alone, and refuses the rest with ErrUnsupported. Each schema part has a JSON
// Schema generated from the types' struct tags (schema.go: Provider.JSONSchema), which
// provider.describe returns, the UI's forms and the CLI's checks use, and DecodePart validates
// values against before decoding them (immutable fields and ValidUpdate on update). BaseStack and BaseMachine carry what kloud gives a provider; State is the
// machine state machine with the allowed-method table of the original Koding. The value types
// that travel beyond a provider (State, Capability, PortRule, Resource, Constraint, Description)
// are provider/ptype's, which links only the standard library; ptype.go names them here.
//
// The contract links neither the transport (kite) nor the agent (klient); a test enforces it.
// The planner that waits for machines' agents after a build is kloud/stackbuild's.
package provider
