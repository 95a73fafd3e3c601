package api

import (
	"encoding/json"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// Typed parameters and presets (docs/user-guide.md "Parameters and presets"): template.parameters,
// and the parameters and preset of stack.create and stack.update.

// TemplateParameter is a variable of a template offered to whoever creates a stack of it
// (ptype.Parameter: provider/tmpl reads it, template.parameters returns it).
type TemplateParameter = ptype.Parameter

// ParameterValidation is a variable's validation block as written.
type ParameterValidation = ptype.ParameterValidation

// TemplatePreset is a named set of parameter values (sensitive ones shown as "(sensitive)").
type TemplatePreset struct {
	Name        string                     `json:"name"`
	Description string                     `json:"description,omitempty"`
	Default     bool                       `json:"default,omitempty"`
	Values      map[string]json.RawMessage `json:"values"`
}

// TemplateParametersResult is the result of template.parameters (params: TemplateGetParams).
type TemplateParametersResult struct {
	TemplateID string              `json:"templateId"`
	Rev        int                 `json:"rev"`
	Parameters []TemplateParameter `json:"parameters"`
	Presets    []TemplatePreset    `json:"presets"`
}
