package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"

	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/userdata"
)

// Provider describes one infrastructure provider.
type Provider struct {
	// Name is the provider's name in templates and credentials, e.g. "local".
	Name string
	// ResourceType is the Terraform resource type of its machines, e.g. "kloudlocal_machine".
	ResourceType string
	// UserDataAttr is the resource attribute that takes cloud-init user data (default
	// "user_data"). Empty with NoCloudInit set means the provider delivers the agent itself.
	UserDataAttr string
	NoCloudInit  bool
	// Description is shown in provider.describe.
	Description string
	Schema      Schema
	// Kind is KindBuiltin ("" means builtin) or KindPlugin (set by a plugin's proxy); Version is
	// a plugin's own version ("" for builtin providers). Both are shown in provider.describe.
	Kind    string
	Version string
	// Stack builds the provider's stack operations for one request.
	Stack func(*BaseStack) (Stack, error)
	// Machine builds the provider's machine operations for one machine.
	Machine func(*BaseMachine) (Machine, error)
	// KloudURL, if set, returns the URL its machines reach kloud at, given the URL users use
	// (the local provider's machines see kloud on their bridge). Nil: the same URL.
	KloudURL func(publicURL string) string
	// Available reports whether the provider can work on this host (nil if it can); kloud
	// shows the reason at startup and in provider.describe. Nil func: always available.
	Available func() error
	// Terraform, if not nil, lists the Terraform providers it offers to templates (see
	// DeclareTerraform and TerraformProviders; nil: derived from ResourceType).
	Terraform []TerraformProvider
	// Handler, if set, is the provider's own HTTP service, which kloud mounts on its HTTP server
	// under HandlerPrefix(Name) (see handler.go). Nil: none.
	Handler http.Handler
	// Capabilities is what the provider can do (see Caps). Nil: derived from what it implements
	// (start, stop and info always; the optional interfaces; bootstrap with a
	// Schema.NewBootstrap). A plugin's proxy sets it from the plugin's handshake; an in-tree
	// provider may set it to advertise less.
	Capabilities []Capability
	// Decoder, if set, decodes and normalizes (defaults filled) a value of schema part part
	// ("credential", "bootstrap", "metadata") given its raw JSON and, for an update, the old
	// value. A plugin's proxy sets it: the plugin decodes in its own process with its own types.
	// Nil: decoded in process with the Schema's New* type (see DecodePart).
	Decoder func(ctx context.Context, part string, raw, old json.RawMessage) (json.RawMessage, error)
	// Constraints, if set, returns the provider's constraints vocabulary (ptype/constraints.go): what
	// its machines may ask for, shown by provider.describe and checked by its
	// ConstraintsValidator. It may depend on the host (the memory it has). Nil: none declared.
	Constraints func() []Constraint
	// Inventory, if set, lists and removes the resources the provider made for this kloud
	// instance (resources.go; capability CapResources): kloud gc uses it. Nil: none.
	Inventory ResourceManager
	// Buckets, if set, provisions object buckets for stacks' bucket claims (bucket.go;
	// capability CapBucket). Nil: the provider's stacks cannot claim buckets.
	Buckets BucketProvisioner
	// MoreCaps, if set, returns capabilities that depend on the host's state at the moment (a
	// daemon that may come up after kloud started), added by Caps to the others on every call:
	// it must be quick (cache what it learns for a short time). A plugin's capabilities are
	// taken once, at its handshake. Nil: none.
	MoreCaps func() []Capability
}

// ErrUnsupported is returned (wrapped) by an operation the provider does not offer, e.g. a
// plugin's proxy machine asked to Resize by a plugin that did not advertise CapResize. Kloud maps
// it to -32005.
var ErrUnsupported = errors.New("not supported by this provider")

// Schema holds the provider's typed data. Each constructor returns a pointer to a struct whose
// fields carry `json` names and `kloud:"Label[,secret][,required][,immutable]"` tags, and
// optionally `default:"v"`, `enum:"a|b|c"`, `min:"1"`, `max:"64"` and `doc:"one line"`; the
// JSON Schema of each part (Provider.JSONSchema) and provider.describe are built from those tags
// (schema.go). A type with a `Valid() error` method is validated after decoding; one with
// `ValidUpdate(old any) error` is asked whether an update from old (same type) is allowed.
type Schema struct {
	NewCredential func() any // nil: the provider takes no credential
	NewBootstrap  func() any // nil: no bootstrap outputs
	NewMetadata   func() any // nil: machine metadata is the resource's attributes
	// JSON, if non-nil, holds the JSON Schema of each part by name (PartCredential, ...),
	// replacing the schemas generated from the New* types: a plugin's proxy sets it from the
	// handshake. A part absent from it has no schema.
	JSON map[string]json.RawMessage
}

// Stack is what a provider does for a stack.
type Stack interface {
	// VerifyCredential checks that the credential works (credential.authenticate).
	VerifyCredential(ctx context.Context, c *Credential) error
	// BootstrapTemplates returns templates applied once per credential and team before any
	// stack uses the credential (credential.bootstrap); their outputs decode into the
	// Schema.NewBootstrap type. Nil: nothing to bootstrap.
	BootstrapTemplates(ctx context.Context, c *Credential) ([]*Template, error)
	// ApplyTemplate rewrites the stack's template before apply: defaults from the credential
	// and bootstrap outputs, and the agent's user data for every machine (BaseStack.InjectUserData
	// does the common part). It returns the template to apply.
	ApplyTemplate(ctx context.Context, c *Credential) (*Template, error)
}

// Machine is what a provider does for one machine. Metadata returned (non-nil) is merged into
// the machine's stored metadata.
type Machine interface {
	Start(ctx context.Context) (meta any, err error)
	Stop(ctx context.Context) (meta any, err error)
	// Info reports the machine's real state; kloud treats it as the truth and reconciles its
	// store with it.
	Info(ctx context.Context) (State, any, error)
}

// ConsoleLogger is implemented by machines whose console output (cloud-init's log) can be read
// without the agent, like a cloud's "get console output". kloud/stackbuild's planner uses it to
// say which provisioning step failed when the agent never came up; without it, the error names
// the last step kloud saw.
type ConsoleLogger interface {
	ConsoleLog(ctx context.Context) (string, error)
}

// Resizer is implemented by machines that can change their resources. Without it,
// machine.resize is refused with a clear error.
type Resizer interface {
	Resize(ctx context.Context, memoryMB int, cpus float64) (meta any, err error)
}

// ConstraintsValidator is implemented by stacks that check machine attributes (memory, cpus,
// zones) at plan time. Without it, Terraform's own validation is all there is.
type ConstraintsValidator interface {
	ValidateConstraints(ctx context.Context, attrs map[string]any) error
}

// Registry holds providers by name: the providers one kloud offers. It is a value the caller
// builds and passes to kloud (kloud.Options.Providers), as database/sql drivers are registered,
// but there is no global registry: two kloud servers in one process (tests) offer different
// providers.
type Registry struct {
	mu        sync.RWMutex
	providers map[string]*Provider
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{providers: map[string]*Provider{}} }

// Register adds p. It panics if p is nil, unnamed, or its name is taken.
func (r *Registry) Register(p *Provider) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p == nil || p.Name == "" {
		panic("provider: Register of a nil or unnamed provider")
	}
	if _, dup := r.providers[p.Name]; dup {
		panic("provider: Register called twice for provider " + p.Name)
	}
	if p.UserDataAttr == "" && !p.NoCloudInit {
		p.UserDataAttr = "user_data"
	}
	r.providers[p.Name] = p
}

// Replace registers p, or replaces the provider of the same name (a plugin's proxy when the
// plugin registers again). It panics if p is nil or unnamed.
func (r *Registry) Replace(p *Provider) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p == nil || p.Name == "" {
		panic("provider: Replace of a nil or unnamed provider")
	}
	if p.UserDataAttr == "" && !p.NoCloudInit {
		p.UserDataAttr = "user_data"
	}
	r.providers[p.Name] = p
}

// Lookup returns the provider called name.
func (r *Registry) Lookup(name string) (*Provider, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p, ok := r.providers[name]
	if !ok {
		return nil, fmt.Errorf("unknown provider %q (this kloud does not offer it)", name)
	}
	return p, nil
}

// ByResourceType returns the provider whose machines have Terraform type typ, or nil.
func (r *Registry) ByResourceType(typ string) *Provider {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, p := range r.providers {
		if p.ResourceType == typ {
			return p
		}
	}
	return nil
}

// Names returns the registered names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.providers))
	for n := range r.providers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Credential is a credential as a provider sees it: the decoded secret value (never returned to
// users by kloud) and the bootstrap outputs.
type Credential struct {
	ID        string
	Title     string
	Provider  string
	Team      string
	Value     any // *Schema.NewCredential type, or map[string]any
	Bootstrap any // *Schema.NewBootstrap type, or nil
}

// Template is Terraform configuration: file name → content (.tf HCL or .tf.json), and
// variable values passed to terraform.
type Template struct {
	// Key is the terraformer content id for bootstrap templates (optional).
	Key       string
	Files     map[string][]byte
	Variables map[string]any
	// Config is Files parsed, if whoever made the Template parsed them (kloud parses a stack's
	// files once per build and hands the result on). Use Parsed, which checks that it still
	// holds Files; whoever edits Config sets Files = Config.Files() after.
	Config *tmpl.Config `json:"-"`
}

// Parsed returns t.Files parsed: t.Config if it holds them, else a fresh parse, kept in
// t.Config for the next caller.
func (t *Template) Parsed() (*tmpl.Config, error) {
	if t.Config.Holds(t.Files) {
		return t.Config, nil
	}
	cfg, err := tmpl.Parse(t.Files)
	if err != nil {
		return nil, err
	}
	t.Config = cfg
	return cfg, nil
}

// MachineSpec is a machine of a stack as the template declares it.
type MachineSpec struct {
	ID       string // kloud's machine id
	Label    string // "web" or, with count, "web.0"
	Resource string // Terraform resource name ("web")
	Index    *int   // count index, nil without count
	Provider string
	// KiteID is the id the machine's agent will register with (the jti of its kite key),
	// set when user data is rendered.
	KiteID string
	// Owner is the username of the machine's owner.
	Owner string
	// Attributes are the planned resource attributes.
	Attributes map[string]any
}

// BaseStack is what kloud gives a provider for stack operations.
type BaseStack struct {
	Provider *Provider
	StackID  string
	Team     string
	Owner    string
	Template *Template
	Machines []*MachineSpec // this provider's machines in the stack
	// AgentConfig returns what machine m's agent needs (its kite key, kloud's URLs, the owner).
	// Kloud prepares every machine's before ApplyTemplate runs (keys minted, m.KiteID recorded):
	// it is a lookup that writes nothing. Providers render it with userdata.Render (cloud-init)
	// or userdata.RenderScript; InjectUserData does that for the common case.
	AgentConfig func(ctx context.Context, m *MachineSpec) (userdata.Config, error)
	Log         *slog.Logger
	// Vacating: the template declares none of this provider's machines, but the stack still has
	// some (a stack update removes them all). ApplyTemplate renders no machine and configures
	// the provider (block, credentials), as for a destroy, so Terraform can destroy them.
	Vacating bool
}

// BaseMachine is what kloud gives a provider for machine operations.
type BaseMachine struct {
	ID         string
	Label      string
	StackID    string
	Provider   *Provider
	KiteID     string
	Owner      string
	Attributes map[string]any // Terraform state attributes of the resource instance
	Meta       map[string]any
	Credential *Credential
	Log        *slog.Logger
}
