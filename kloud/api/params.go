package api

import "encoding/json"

// Typed parameters and presets (docs/user-guide.md "Parameters and presets"): template.parameters,
// and the parameters and preset of stack.create and stack.update.

// TemplateParameter is a variable of a template offered to whoever creates a stack of it: its
// Terraform declaration (type, description, default, validation, sensitive, nullable) and
// kloud's metadata from the template's kloud_parameter block.
type TemplateParameter struct {
	Name        string `json:"name"`
	DisplayName string `json:"displayName,omitempty"`
	Description string `json:"description,omitempty"`
	// Type is the type constraint as Terraform spells it (string, number, bool, list(string),
	// map(number), object({...})); "any" when the variable has none.
	Type string `json:"type"`
	// Default is the default value (JSON); absent without one, and for sensitive parameters.
	Default   json.RawMessage   `json:"default,omitempty"`
	Required  bool              `json:"required"`
	Sensitive bool              `json:"sensitive,omitempty"`
	Nullable  bool              `json:"nullable"`
	Choices   []json.RawMessage `json:"choices,omitempty"`
	// Mutable is false when stack.update may not change the value of a built stack.
	Mutable     bool                  `json:"mutable"`
	Order       int                   `json:"order,omitempty"`
	Validations []ParameterValidation `json:"validations,omitempty"`
	File        string                `json:"file"`
	Line        int                   `json:"line"`
}

// ParameterValidation is a variable's validation block as written.
type ParameterValidation struct {
	Condition    string `json:"condition"`
	ErrorMessage string `json:"errorMessage"`
}

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
