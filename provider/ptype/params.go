package ptype

import "encoding/json"

// Parameter is a variable of a template offered to whoever creates a stack of it (JSON camelCase:
// what template.parameters returns): its Terraform declaration (type, description, default,
// validation, sensitive, nullable) and kloud's metadata from the template's kloud_parameter
// block. provider/tmpl reads it from a template (tmpl.Parameter); kloud/api names it
// TemplateParameter.
type Parameter struct {
	Name        string `json:"name"`
	DisplayName string `json:"displayName,omitempty"`
	Description string `json:"description,omitempty"`
	// Type is the type constraint as Terraform spells it: string, number, bool, list(string),
	// map(number), object({...}); "any" when the variable has none.
	Type string `json:"type"`
	// Default is the default value (JSON); absent when there is none, or when Sensitive.
	Default   json.RawMessage `json:"default,omitempty"`
	Required  bool            `json:"required"`
	Sensitive bool            `json:"sensitive,omitempty"`
	Nullable  bool            `json:"nullable"`
	// Choices, when set, are the only values allowed (JSON values of Type).
	Choices []json.RawMessage `json:"choices,omitempty"`
	// Mutable is false when the value cannot change once the stack is built.
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
