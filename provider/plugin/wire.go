package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

// Version is the plugin API version this build speaks. A plugin sends the versions it speaks
// in plugin.register; kloud picks the highest it speaks too, or refuses naming both lists.
const Version = 1

// supported are the plugin API versions kloud's side (Host) accepts.
var supported = []int{1}

// SupportedVersions returns the plugin API versions the Host accepts.
func SupportedVersions() []int { return slices.Clone(supported) }

// The environment of a plugin process.
const (
	EnvURL      = "KLOUD_PLUGIN_URL"       // kloud's kite URL, ws(s):// or http(s)://host/kite
	EnvKey      = "KLOUD_PLUGIN_KEY"       // the plugin key (launched plugins)
	EnvKeyFile  = "KLOUD_PLUGIN_KEY_FILE"  // or a file holding it (remote plugins)
	EnvStateDir = "KLOUD_PLUGIN_STATE_DIR" // a directory the plugin may write (launched: its own)
	// EnvCA is the PEM of a CA to trust beside the system's for a wss:// URL (a kloud with TLS
	// whose certificate no public CA signed; launched plugins get kloud's --ca-cert).
	EnvCA = "KLOUD_PLUGIN_CA"
	// EnvServerName is the name kloud's certificate is checked against when it differs from
	// the URL's host (launched plugins dial the loopback address, the certificate names the
	// public one).
	EnvServerName = "KLOUD_PLUGIN_TLS_SERVER_NAME"
)

// MethodRegister is the one method a plugin calls on kloud (routed by kloud with
// kitekey.Gate(h, kitekey.KindPluginKey); Host.Register is its body).
const MethodRegister = "plugin.register"

// notifyReplaced is the notification kloud sends a plugin whose connection it closes because
// another registered the same provider: the plugin stops (Run returns ErrReplaced).
const notifyReplaced = "plugin.replaced"

type replacedParams struct {
	Reason string `json:"reason"`
}

// The methods kloud calls on a plugin, over the connection the plugin dialed.
const (
	MethodVerifyCredential    = "provider.verifyCredential"
	MethodBootstrapTemplates  = "provider.bootstrapTemplates"
	MethodApplyTemplate       = "provider.applyTemplate"
	MethodValidateConstraints = "provider.validateConstraints"
	MethodDecode              = "provider.decode"
	MethodAvailable           = "provider.available"
	MethodHTTP                = "provider.http"
	MethodMachineStart        = "machine.start"
	MethodMachineStop         = "machine.stop"
	MethodMachineInfo         = "machine.info"
	MethodMachineConsoleLog   = "machine.consoleLog"
	MethodMachineResize       = "machine.resize"
)

// MaxHTTPBody bounds the body of a request to, and of a response from, a plugin's HTTP service
// (Provider.Handler), which travels in one kite frame.
const MaxHTTPBody = 2 << 20

// RegisterParams are plugin.register's params.
type RegisterParams struct {
	Versions      []int    `json:"versions"`      // plugin API versions it speaks
	PluginVersion string   `json:"pluginVersion"` // the plugin's own version
	Provider      Manifest `json:"provider"`
}

// check checks the params (Host.Register runs it once it knows the caller is a plugin).
func (p *RegisterParams) check() error {
	if len(p.Versions) == 0 || len(p.Versions) > 16 {
		return fmt.Errorf("versions: 1 to 16 plugin API versions, got %d", len(p.Versions))
	}
	if len(p.PluginVersion) > 128 {
		return errors.New("pluginVersion is longer than 128 bytes")
	}
	return p.Provider.Validate()
}

// Manifest is the wire form of a *provider.Provider: everything kloud needs to know about it
// without calling it.
type Manifest struct {
	Name         string `json:"name"`
	ResourceType string `json:"resourceType"`
	UserDataAttr string `json:"userDataAttr,omitempty"`
	NoCloudInit  bool   `json:"noCloudInit,omitempty"`
	Description  string `json:"description,omitempty"`
	// TerraformProviders are the Terraform providers it offers to stack templates (the template
	// policy's allowlist, provider.TerraformProviders). Empty: derived from ResourceType as for an
	// in-tree provider. They must be in kloud's Terraform mirror to be usable at all.
	TerraformProviders []TerraformProvider   `json:"terraformProviders,omitempty"`
	Capabilities       []provider.Capability `json:"capabilities"`
	// Schemas are the JSON Schemas of its schema parts ("credential", "bootstrap", "metadata").
	Schemas map[string]json.RawMessage `json:"schemas,omitempty"`
	// Fields are the parts' field lists (provider.Fields of the Schema's New* types): kloud builds
	// the proxy's Schema from them, so that it decodes, redacts secrets and describes a plugin's
	// credential like an in-tree one's.
	Fields map[string][]provider.Field `json:"fields,omitempty"`
	// Handler: the provider has an HTTP service (Provider.Handler), which kloud mounts at
	// provider.HandlerPrefix(Name) and forwards to the plugin (provider.http).
	Handler bool `json:"handler,omitempty"`
	// Constraints is its constraints vocabulary (provider.Provider.Constraints) when it
	// registered (constraints.go).
	Constraints []provider.Constraint `json:"constraints,omitempty"`
}

// TerraformProvider is the wire form of a provider.TerraformProvider.
type TerraformProvider struct {
	Name         string   `json:"name"`
	Source       string   `json:"source,omitempty"`
	Types        []string `json:"types,omitempty"`
	ProviderArgs []string `json:"providerArgs,omitempty"`
}

// Schema parts.
const (
	partCredential = "credential"
	partBootstrap  = "bootstrap"
	partMetadata   = "metadata"
)

var parts = []string{partCredential, partBootstrap, partMetadata}

var knownCaps = []provider.Capability{provider.CapStart, provider.CapStop, provider.CapInfo, provider.CapConsoleLog,
	provider.CapResize, provider.CapConstraints, provider.CapBootstrap,
	provider.CapSnapshot,  // snapshot.go
	provider.CapFirewall,  // firewall.go
	provider.CapResources, // resources.go
	provider.CapTemplateRules,
}

// Validate checks a manifest as kloud receives it.
func (m *Manifest) Validate() error {
	if err := kitekey.ValidProviderName(m.Name); err != nil {
		return fmt.Errorf("provider.name: %w", err)
	}
	switch {
	case m.ResourceType == "" || len(m.ResourceType) > 128:
		return errors.New("provider.resourceType: the Terraform resource type of its machines is required (at most 128 bytes)")
	case len(m.Description) > 4096:
		return errors.New("provider.description is longer than 4096 bytes")
	case len(m.UserDataAttr) > 128:
		return errors.New("provider.userDataAttr is longer than 128 bytes")
	}
	for _, c := range m.Capabilities {
		if !slices.Contains(knownCaps, c) {
			return fmt.Errorf("provider.capabilities: unknown capability %q (known: %v)", c, knownCaps)
		}
	}
	if len(m.TerraformProviders) > 16 {
		return errors.New("provider.terraformProviders: more than 16")
	}
	for _, tp := range m.TerraformProviders {
		if tp.Name == "" || len(tp.Name) > 64 || len(tp.Source) > 256 || len(tp.Types) > 256 || len(tp.ProviderArgs) > 64 {
			return fmt.Errorf("provider.terraformProviders: %q: a name (at most 64 bytes), a source, at most 256 types and 64 provider arguments", tp.Name)
		}
		if tp.Name == "terraform" && (tp.Types == nil || slices.Contains(tp.Types, "terraform_remote_state")) {
			// Terraform's built-in provider: only named types, never remote state (another
			// stack's or the host's state files).
			return errors.New("provider.terraformProviders: Terraform's built-in provider needs its types listed, and terraform_remote_state is never offered")
		}
	}
	for part, s := range m.Schemas {
		if !slices.Contains(parts, part) {
			return fmt.Errorf("provider.schemas: unknown part %q (want one of %v)", part, parts)
		}
		if s != nil && string(s) != "null" {
			if len(s) > 1<<20 {
				return fmt.Errorf("provider.schemas.%s is larger than 1 MiB", part)
			}
			if err := provider.CheckSchema(s); err != nil {
				return fmt.Errorf("provider.schemas.%s: %w", part, err)
			}
		}
	}
	for part, fs := range m.Fields {
		if !slices.Contains(parts, part) {
			return fmt.Errorf("provider.fields: unknown part %q (want one of %v)", part, parts)
		}
		if len(fs) > 256 {
			return fmt.Errorf("provider.fields.%s: more than 256 fields", part)
		}
		seen := map[string]bool{}
		for _, f := range fs {
			switch {
			case f.Name == "" || len(f.Name) > 128 || seen[f.Name]:
				return fmt.Errorf("provider.fields.%s: field name %q is empty, too long or repeated", part, f.Name)
			case !slices.Contains([]string{"string", "integer", "number", "boolean"}, f.Type):
				return fmt.Errorf("provider.fields.%s.%s: type %q (want string, integer, number or boolean)", part, f.Name, f.Type)
			}
			seen[f.Name] = true
		}
	}
	return validateConstraintsManifest(m.Constraints) // constraints.go
}

// RegisterResult is plugin.register's result.
type RegisterResult struct {
	Version      int    `json:"version"`      // the plugin API version both sides speak from now on
	KloudVersion string `json:"kloudVersion"` // kloud's version
}

// What travels in the kloud → plugin calls. BaseStack, BaseMachine and Credential lose their
// funcs and loggers on the way; the plugin side rebuilds them around its own provider.

type wireTemplate struct {
	Key       string            `json:"key,omitempty"`
	Files     map[string][]byte `json:"files"`
	Variables map[string]any    `json:"variables,omitempty"`
}

type wireMachineSpec struct {
	ID         string         `json:"id"`
	Label      string         `json:"label"`
	Resource   string         `json:"resource"`
	Index      *int           `json:"index,omitempty"`
	Provider   string         `json:"provider"`
	KiteID     string         `json:"kiteId,omitempty"`
	Owner      string         `json:"owner"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// wireAgentConfig is userdata.Config: one machine's agent configuration, its own agent key
// included (never a signing key).
type wireAgentConfig struct {
	Username     string         `json:"username"`
	Hostname     string         `json:"hostname,omitempty"`
	KiteKey      string         `json:"kiteKey"`
	KontrolURL   string         `json:"kontrolURL"`
	KlientURL    string         `json:"klientURL"`
	KlientSHA256 string         `json:"klientSHA256"`
	CACert       string         `json:"caCert,omitempty"`
	UserData     string         `json:"userData,omitempty"`
	Extra        map[string]any `json:"extra,omitempty"`
}

type wireStack struct {
	StackID  string            `json:"stackId,omitempty"`
	Team     string            `json:"team,omitempty"`
	Owner    string            `json:"owner,omitempty"`
	Template *wireTemplate     `json:"template,omitempty"`
	Machines []wireMachineSpec `json:"machines,omitempty"`
	// AgentConfigs are the agent configurations of Machines by machine id (applyTemplate only):
	// the plugin side's BaseStack.AgentConfig looks them up.
	AgentConfigs map[string]wireAgentConfig `json:"agentConfigs,omitempty"`
	// Vacating is provider.BaseStack.Vacating (applyTemplate only).
	Vacating bool `json:"vacating,omitempty"`
}

type wireCredential struct {
	ID        string          `json:"id,omitempty"`
	Title     string          `json:"title,omitempty"`
	Provider  string          `json:"provider,omitempty"`
	Team      string          `json:"team,omitempty"`
	Value     json.RawMessage `json:"value,omitempty"`
	Bootstrap json.RawMessage `json:"bootstrap,omitempty"`
}

type wireMachine struct {
	ID         string          `json:"id"`
	Label      string          `json:"label,omitempty"`
	StackID    string          `json:"stackId,omitempty"`
	KiteID     string          `json:"kiteId,omitempty"`
	Owner      string          `json:"owner,omitempty"`
	Attributes map[string]any  `json:"attributes,omitempty"`
	Meta       map[string]any  `json:"meta,omitempty"`
	Credential *wireCredential `json:"credential,omitempty"`
}

type stackParams struct {
	Stack      wireStack       `json:"stack"`
	Credential *wireCredential `json:"credential,omitempty"`
	// Attributes: validateConstraints only.
	Attributes map[string]any `json:"attributes,omitempty"`
}

func (p *stackParams) Validate() error {
	for _, m := range p.Stack.Machines {
		if m.ID == "" {
			return errors.New("stack.machines: a machine without id")
		}
	}
	return nil
}

type templatesResult struct {
	Templates []wireTemplate `json:"templates"`
}

type templateResult struct {
	Template wireTemplate `json:"template"`
}

type machineParams struct {
	Machine wireMachine `json:"machine"`
	// MemoryMB and CPUs: resize only.
	MemoryMB int     `json:"memoryMB,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
}

func (p *machineParams) Validate() error {
	if p.Machine.ID == "" {
		return errors.New("machine.id is required")
	}
	if p.MemoryMB < 0 || p.CPUs < 0 {
		return errors.New("memoryMB and cpus cannot be negative")
	}
	return nil
}

type metaResult struct {
	Meta json.RawMessage `json:"meta,omitempty"`
}

type infoResult struct {
	State provider.State  `json:"state"`
	Meta  json.RawMessage `json:"meta,omitempty"`
}

type consoleLogResult struct {
	Log string `json:"log"`
}

type decodeParams struct {
	Part string          `json:"part"`
	Raw  json.RawMessage `json:"raw"`
	Old  json.RawMessage `json:"old,omitempty"`
}

func (p *decodeParams) Validate() error {
	if !slices.Contains(parts, p.Part) {
		return fmt.Errorf("part %q: want one of %v", p.Part, parts)
	}
	return nil
}

type decodeResult struct {
	Value json.RawMessage `json:"value"`
}

type availableResult struct {
	Unavailable string `json:"unavailable,omitempty"` // why not; "" if available
}

type httpParams struct {
	Method     string      `json:"method"`
	URL        string      `json:"url"` // path and query, e.g. /provider/example/x?y=1
	Header     http.Header `json:"header,omitempty"`
	Body       []byte      `json:"body,omitempty"`
	Host       string      `json:"host,omitempty"`
	RemoteAddr string      `json:"remoteAddr,omitempty"`
}

func (p *httpParams) Validate() error {
	switch {
	case p.Method == "" || len(p.Method) > 32:
		return errors.New("method is required")
	case p.URL == "" || p.URL[0] != '/':
		return fmt.Errorf("url %q: want a path starting with /", p.URL)
	case len(p.Body) > MaxHTTPBody:
		return fmt.Errorf("body is larger than %d bytes", MaxHTTPBody)
	}
	return nil
}

type httpResult struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// Conversions between provider's types and the wire's.

func toWireTemplate(t *provider.Template) *wireTemplate {
	if t == nil {
		return nil
	}
	return &wireTemplate{Key: t.Key, Files: t.Files, Variables: t.Variables}
}

func (w *wireTemplate) template() *provider.Template {
	if w == nil {
		return nil
	}
	return &provider.Template{Key: w.Key, Files: w.Files, Variables: w.Variables}
}

func toWireSpec(m *provider.MachineSpec) wireMachineSpec {
	return wireMachineSpec{ID: m.ID, Label: m.Label, Resource: m.Resource, Index: m.Index, Provider: m.Provider,
		KiteID: m.KiteID, Owner: m.Owner, Attributes: m.Attributes}
}

func (w wireMachineSpec) spec() *provider.MachineSpec {
	return &provider.MachineSpec{ID: w.ID, Label: w.Label, Resource: w.Resource, Index: w.Index, Provider: w.Provider,
		KiteID: w.KiteID, Owner: w.Owner, Attributes: w.Attributes}
}

func toWireAgentConfig(c userdata.Config) wireAgentConfig {
	return wireAgentConfig{Username: c.Username, Hostname: c.Hostname, KiteKey: c.KiteKey, KontrolURL: c.KontrolURL,
		KlientURL: c.KlientURL, KlientSHA256: c.KlientSHA256, CACert: c.CACert, UserData: c.UserData, Extra: c.Extra}
}

func (w wireAgentConfig) config() userdata.Config {
	return userdata.Config{Username: w.Username, Hostname: w.Hostname, KiteKey: w.KiteKey, KontrolURL: w.KontrolURL,
		KlientURL: w.KlientURL, KlientSHA256: w.KlientSHA256, CACert: w.CACert, UserData: w.UserData, Extra: w.Extra}
}

func toWireCredential(c *provider.Credential) (*wireCredential, error) {
	if c == nil {
		return nil, nil
	}
	w := &wireCredential{ID: c.ID, Title: c.Title, Provider: c.Provider, Team: c.Team}
	var err error
	if c.Value != nil {
		if w.Value, err = json.Marshal(c.Value); err != nil {
			return nil, fmt.Errorf("credential %s: %w", c.ID, err)
		}
	}
	if c.Bootstrap != nil {
		if w.Bootstrap, err = json.Marshal(c.Bootstrap); err != nil {
			return nil, fmt.Errorf("credential %s bootstrap: %w", c.ID, err)
		}
	}
	return w, nil
}

func toWireMachine(b *provider.BaseMachine) (wireMachine, error) {
	cred, err := toWireCredential(b.Credential)
	if err != nil {
		return wireMachine{}, err
	}
	return wireMachine{ID: b.ID, Label: b.Label, StackID: b.StackID, KiteID: b.KiteID, Owner: b.Owner,
		Attributes: b.Attributes, Meta: b.Meta, Credential: cred}, nil
}

// isNull reports whether raw holds no value.
func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }
