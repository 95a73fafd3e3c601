package api

// ConstraintViolation is one machine attribute a plan was refused for (stack.plan, stack.create,
// stack.apply): the error's data.details is a list of them. Constraint, Attribute, Value,
// Allowed and Nearest are the provider's (provider.ConstraintError) when it said them; Message
// is always set.
type ConstraintViolation struct {
	Machine    string `json:"machine"`  // the machine's label ("web.0")
	Provider   string `json:"provider"` // its provider
	Resource   string `json:"resource"` // its Terraform address without index ("kloudlocal_machine.web")
	Constraint string `json:"constraint,omitempty"`
	Attribute  string `json:"attribute,omitempty"`
	Value      any    `json:"value,omitempty"`
	Allowed    string `json:"allowed,omitempty"`
	Nearest    any    `json:"nearest,omitempty"`
	Message    string `json:"message"`
}

// ConstraintViolationType is data.type of the error that refuses a plan for its constraints
// (code -32602, invalid params).
const ConstraintViolationType = "constraintViolation"
