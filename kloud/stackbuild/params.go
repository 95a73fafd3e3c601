package stackbuild

import (
	"errors"
	"fmt"
)

// JobApply is the job kind of stack.apply (a build, or a destroy with Destroy set).
const JobApply = "stack.apply"

// ApplyParams are a stack.apply job's parameters, as the job document stores them (job.describe
// shows them under "params": stackId, destroy, lease).
type ApplyParams struct {
	StackID string `json:"stackId"`
	Destroy bool   `json:"destroy"`
	// Lease is the owner name of the stack's lease (the store lease "stack/<id>") the call took;
	// the job renews it, and a recovered job takes it again under the same name.
	Lease string `json:"lease"`
}

// Map is p as a job document stores it.
func (p ApplyParams) Map() map[string]any {
	return map[string]any{"stackId": p.StackID, "destroy": p.Destroy, "lease": p.Lease}
}

// ParseApplyParams reads a stack.apply job's parameters. A job without a stack id or lease owner
// was not made by stack.apply (or its document is damaged): it is an error, not a zero value.
func ParseApplyParams(m map[string]any) (ApplyParams, error) {
	var p ApplyParams
	var ok bool
	if p.StackID, ok = m["stackId"].(string); !ok || p.StackID == "" {
		return p, errors.New("stack.apply job without a stackId")
	}
	if p.Lease, ok = m["lease"].(string); !ok || p.Lease == "" {
		return p, fmt.Errorf("stack.apply job of stack %s without a lease owner", p.StackID)
	}
	if v, has := m["destroy"]; has {
		if p.Destroy, ok = v.(bool); !ok {
			return p, fmt.Errorf("stack.apply job of stack %s: destroy is %T, not a bool", p.StackID, v)
		}
	}
	return p, nil
}
