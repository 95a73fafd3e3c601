// Package pluginapi is the provider plugin protocol's wire contract: the plugin API version, the
// environment of a plugin process, the method names, and plugin.register's params (the
// Manifest) and result. It links no plugin host, no userdata and no JSON Schema compiler (only
// kitekey and provider/ptype): kloud/api (the client package) and plugins that speak the
// protocol by hand import it; provider/plugin (Serve, Host, the proxies) re-exports it under its
// old names and compiles a manifest's schemas (plugin.ValidateManifest).
//
// Start reading at RegisterParams and Manifest.
package pluginapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider/ptype"
)

// Version is the plugin API version this build speaks. A plugin sends the versions it speaks
// in plugin.register; kloud picks the highest it speaks too, or refuses naming both lists.
const Version = 1

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
// kitekey.Gate(h, kitekey.KindPluginKey); provider/plugin's Host.Register is its body).
const MethodRegister = "plugin.register"

// NotifyReplaced is the notification kloud sends a plugin whose connection it closes because
// another registered the same provider: the plugin stops.
const NotifyReplaced = "plugin.replaced"

// ReplacedParams are NotifyReplaced's params.
type ReplacedParams struct {
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

// Check checks the params (kloud runs it once it knows the caller is a plugin).
func (p *RegisterParams) Check() error {
	if len(p.Versions) == 0 || len(p.Versions) > 16 {
		return fmt.Errorf("versions: 1 to 16 plugin API versions, got %d", len(p.Versions))
	}
	if len(p.PluginVersion) > 128 {
		return errors.New("pluginVersion is longer than 128 bytes")
	}
	return p.Provider.Validate()
}

// RegisterResult is plugin.register's result.
type RegisterResult struct {
	Version      int    `json:"version"`      // the plugin API version both sides speak from now on
	KloudVersion string `json:"kloudVersion"` // kloud's version
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
	TerraformProviders []TerraformProvider `json:"terraformProviders,omitempty"`
	Capabilities       []ptype.Capability  `json:"capabilities"`
	// Schemas are the JSON Schemas of its schema parts ("credential", "bootstrap", "metadata").
	Schemas map[string]json.RawMessage `json:"schemas,omitempty"`
	// Fields are the parts' field lists (provider.Fields of the Schema's New* types): kloud builds
	// the proxy's Schema from them, so that it decodes, redacts secrets and describes a plugin's
	// credential like an in-tree one's.
	Fields map[string][]ptype.Field `json:"fields,omitempty"`
	// Handler: the provider has an HTTP service (Provider.Handler), which kloud mounts at
	// provider.HandlerPrefix(Name) and forwards to the plugin (provider.http).
	Handler bool `json:"handler,omitempty"`
	// Constraints is its constraints vocabulary (provider.Provider.Constraints) when it
	// registered.
	Constraints []ptype.Constraint `json:"constraints,omitempty"`
}

// TerraformProvider is the wire form of a provider.TerraformProvider.
type TerraformProvider struct {
	Name         string   `json:"name"`
	Source       string   `json:"source,omitempty"`
	Types        []string `json:"types,omitempty"`
	ProviderArgs []string `json:"providerArgs,omitempty"`
}

// Schema parts: the keys of Manifest.Schemas and Manifest.Fields, and provider.decode's part.
const (
	PartCredential = "credential"
	PartBootstrap  = "bootstrap"
	PartMetadata   = "metadata"
)

// Parts returns the schema parts.
func Parts() []string { return []string{PartCredential, PartBootstrap, PartMetadata} }

// KnownCapabilities returns the capabilities a manifest may advertise.
func KnownCapabilities() []ptype.Capability {
	return []ptype.Capability{ptype.CapStart, ptype.CapStop, ptype.CapInfo, ptype.CapConsoleLog,
		ptype.CapResize, ptype.CapConstraints, ptype.CapBootstrap,
		ptype.CapSnapshot, ptype.CapFirewall, ptype.CapResources, ptype.CapTemplateRules, ptype.CapBucket,
	}
}

// MaxConstraints bounds a manifest's constraints vocabulary.
const MaxConstraints = 64

// Validate checks a manifest as kloud receives it, all but compiling its schemas: each is checked
// to be a JSON object of the 2020-12 dialect describing an object (ptype.CheckSchemaHeader); kloud
// (provider/plugin's Host) and Serve compile them too (plugin.ValidateManifest).
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
	knownCaps := KnownCapabilities()
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
	parts := Parts()
	for part, s := range m.Schemas {
		if !slices.Contains(parts, part) {
			return fmt.Errorf("provider.schemas: unknown part %q (want one of %v)", part, parts)
		}
		if s != nil && string(s) != "null" {
			if len(s) > 1<<20 {
				return fmt.Errorf("provider.schemas.%s is larger than 1 MiB", part)
			}
			if err := ptype.CheckSchemaHeader(s); err != nil {
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
	return validateConstraints(m.Constraints)
}

// validateConstraints checks a manifest's vocabulary as kloud receives it.
func validateConstraints(vocab []ptype.Constraint) error {
	if len(vocab) > MaxConstraints {
		return fmt.Errorf("provider.constraints: %d, at most %d", len(vocab), MaxConstraints)
	}
	for _, c := range vocab {
		if len(c.Name) > 64 || len(c.Attribute) > 128 || len(c.Description) > 1024 || len(c.Values) > 256 || len(c.Conflicts) > 16 {
			return fmt.Errorf("provider.constraints: %q: a name of at most 64 bytes, an attribute of 128, at most 256 values and 16 conflicts", c.Name)
		}
	}
	if err := ptype.CheckVocabulary(vocab); err != nil {
		return fmt.Errorf("provider.constraints: %w", err)
	}
	return nil
}
