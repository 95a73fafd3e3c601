package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/pluginapi"
	"github.com/kloud-dev/kloud/userdata"
)

// The plugin protocol's public wire contract lives in provider/pluginapi (a leaf that kloud's
// client package can link); these are its names here, for plugin authors and this package.

// Version is the plugin API version this build speaks (pluginapi.Version).
const Version = pluginapi.Version

// supported are the plugin API versions kloud's side (Host) accepts.
var supported = []int{1}

// SupportedVersions returns the plugin API versions the Host accepts.
func SupportedVersions() []int { return slices.Clone(supported) }

// The environment of a plugin process (pluginapi.Env*).
const (
	EnvURL        = pluginapi.EnvURL
	EnvKey        = pluginapi.EnvKey
	EnvKeyFile    = pluginapi.EnvKeyFile
	EnvStateDir   = pluginapi.EnvStateDir
	EnvCA         = pluginapi.EnvCA
	EnvServerName = pluginapi.EnvServerName
)

// MethodRegister is the one method a plugin calls on kloud (routed by kloud with
// kitekey.Gate(h, kitekey.KindPluginKey); Host.Register is its body).
const MethodRegister = pluginapi.MethodRegister

// notifyReplaced is the notification kloud sends a plugin whose connection it closes because
// another registered the same provider: the plugin stops (Run returns ErrReplaced).
const notifyReplaced = pluginapi.NotifyReplaced

type replacedParams = pluginapi.ReplacedParams

// The methods kloud calls on a plugin, over the connection the plugin dialed.
const (
	MethodVerifyCredential    = pluginapi.MethodVerifyCredential
	MethodBootstrapTemplates  = pluginapi.MethodBootstrapTemplates
	MethodApplyTemplate       = pluginapi.MethodApplyTemplate
	MethodValidateConstraints = pluginapi.MethodValidateConstraints
	MethodDecode              = pluginapi.MethodDecode
	MethodAvailable           = pluginapi.MethodAvailable
	MethodHTTP                = pluginapi.MethodHTTP
	MethodMachineStart        = pluginapi.MethodMachineStart
	MethodMachineStop         = pluginapi.MethodMachineStop
	MethodMachineInfo         = pluginapi.MethodMachineInfo
	MethodMachineConsoleLog   = pluginapi.MethodMachineConsoleLog
	MethodMachineResize       = pluginapi.MethodMachineResize
)

// MaxHTTPBody bounds the body of a request to, and of a response from, a plugin's HTTP service
// (Provider.Handler), which travels in one kite frame.
const MaxHTTPBody = pluginapi.MaxHTTPBody

// RegisterParams are plugin.register's params (pluginapi.RegisterParams).
type RegisterParams = pluginapi.RegisterParams

// Manifest is the wire form of a *provider.Provider (pluginapi.Manifest).
type Manifest = pluginapi.Manifest

// TerraformProvider is the wire form of a provider.TerraformProvider.
type TerraformProvider = pluginapi.TerraformProvider

// RegisterResult is plugin.register's result.
type RegisterResult = pluginapi.RegisterResult

// Schema parts.
const (
	partCredential = pluginapi.PartCredential
	partBootstrap  = pluginapi.PartBootstrap
	partMetadata   = pluginapi.PartMetadata
)

var parts = pluginapi.Parts()

// ValidateManifest is m.Validate and more: each of m's schemas compiles (provider.CheckSchema;
// pluginapi links no JSON Schema compiler and checks only their header). Host.Register and Serve
// check a manifest with it.
func ValidateManifest(m *Manifest) error {
	if err := m.Validate(); err != nil {
		return err
	}
	return compileSchemas(m)
}

// compileSchemas is the part of ValidateManifest that m.Validate leaves out.
func compileSchemas(m *Manifest) error {
	for _, part := range parts {
		if s := m.Schemas[part]; s != nil && string(s) != "null" {
			if err := provider.CheckSchema(s); err != nil {
				return fmt.Errorf("provider.schemas.%s: %w", part, err)
			}
		}
	}
	return nil
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
