package stackbuild

import (
	"errors"
	"fmt"
)

// JobApply is the job kind of stack.apply (a build, or a destroy with Destroy set).
const JobApply = "stack.apply"

// ApplyParams are a stack.apply job's parameters, as the job document stores them (job.get
// shows them under "params": stackId, destroy, lease).
type ApplyParams struct {
	StackID string `json:"stackId"`
	Destroy bool   `json:"destroy"`
	// Lease is the owner name of the stack's lease (the store lease "stack/<id>") the call took;
	// the job renews it, and a recovered job takes it again under the same name.
	Lease string `json:"lease"`
}

// Validate checks params decoded from a job: a job without a stack id or lease owner was not
// made by stack.apply (or its document is damaged): it is an error, not a zero value.
func (p *ApplyParams) Validate() error {
	if p.StackID == "" {
		return errors.New("stack.apply job without a stackId")
	}
	if p.Lease == "" {
		return fmt.Errorf("stack.apply job of stack %s without a lease owner", p.StackID)
	}
	return nil
}

// StackResult is the result of a stack job (stack.apply, stack.update), as job.get shows it: the
// stack; after a build its machines' count, after an update also how many the planner awaited
// (new or replaced), after a destroy Destroyed. A job that failed on its machines' agents has
// only the stack. Machines and Awaited are pointers so that a count of 0 is shown.
type StackResult struct {
	StackID   string `json:"stackId"`
	Machines  *int   `json:"machines,omitempty"`
	Awaited   *int   `json:"awaited,omitempty"`
	Destroyed bool   `json:"destroyed,omitempty"`
}
