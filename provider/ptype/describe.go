package ptype

import (
	"encoding/json"
	"fmt"
)

// Field describes one field of a credential or bootstrap type, for forms in the UI and CLI.
// provider.Fields lists them from a type's struct tags, provider.SchemaFields from a part's JSON
// Schema.
type Field struct {
	Name        string   `json:"name"`
	Type        string   `json:"type"` // string, integer, number, boolean
	Label       string   `json:"label"`
	Secret      bool     `json:"secret,omitempty"`
	Required    bool     `json:"required,omitempty"`
	Immutable   bool     `json:"immutable,omitempty"`
	Default     string   `json:"default,omitempty"`
	Description string   `json:"description,omitempty"` // the `doc` tag
	Enum        []string `json:"enum,omitempty"`        // the allowed values (`enum:"a|b"`)
	Min         string   `json:"min,omitempty"`         // numbers: minimum; strings: minimum length
	Max         string   `json:"max,omitempty"`         // numbers: maximum; strings: maximum length
}

// Kinds of provider (Description.Kind).
const (
	KindBuiltin = "builtin" // compiled into kloud
	KindPlugin  = "plugin"  // out of process (provider/plugin)
)

// Schemas are a provider's JSON Schemas (2020-12) by part; null for a part it does not have.
type Schemas struct {
	Credential json.RawMessage `json:"credential"`
	Bootstrap  json.RawMessage `json:"bootstrap"`
	Metadata   json.RawMessage `json:"metadata"`
}

// Description is provider.describe's entry for one provider.
type Description struct {
	Name         string `json:"name"`
	Kind         string `json:"kind"`              // KindBuiltin or KindPlugin
	Version      string `json:"version,omitempty"` // a plugin's own version
	ResourceType string `json:"resourceType"`
	Description  string `json:"description,omitempty"`
	// Capabilities are what the provider can do (Provider.Caps).
	Capabilities []Capability `json:"capabilities"`
	// Schemas are the JSON Schemas of its parts (Provider.JSONSchema): what the UI's forms and
	// the CLI's --field validation are built from.
	Schemas Schemas `json:"schemas"`
	// Credential and Bootstrap list the fields of those parts (from Schemas), for older
	// clients.
	Credential  []Field `json:"credential"`
	Bootstrap   []Field `json:"bootstrap"`
	CloudInit   bool    `json:"cloudInit"`
	Available   bool    `json:"available"`
	Unavailable string  `json:"unavailable,omitempty"` // why not, in plain language
	// Constraints is the provider's constraints vocabulary (Provider.Constraints), if any.
	Constraints []Constraint `json:"constraints,omitempty"`
}

// SchemaDialect is the $schema of every schema of a provider's parts (JSON Schema 2020-12).
const SchemaDialect = "https://json-schema.org/draft/2020-12/schema"

// CheckSchemaHeader checks what can be checked of a part's JSON Schema without compiling it: a
// JSON object whose "$schema" is SchemaDialect and whose "type" is "object". provider.CheckSchema
// checks this and compiles it.
func CheckSchemaHeader(schema json.RawMessage) error {
	var top struct {
		Schema string `json:"$schema"`
		Type   string `json:"type"`
	}
	if err := json.Unmarshal(schema, &top); err != nil {
		return fmt.Errorf("schema: not a JSON object: %w", err)
	}
	if top.Schema != SchemaDialect || top.Type != "object" {
		return fmt.Errorf("schema: want \"$schema\": %q and \"type\": \"object\", got %q and %q", SchemaDialect, top.Schema, top.Type)
	}
	return nil
}
