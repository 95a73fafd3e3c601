package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kloud-dev/kloud/kloud/model"
	"strings"
)

// StackPlanParams are the params of stack.plan and stack.create.
type StackPlanParams struct {
	TemplateID string `json:"templateId,omitempty"`
	Rev        int    `json:"rev,omitempty"`
	// StackID (stack.plan only) plans an update of that stack instead (stackupdate.go): to
	// Rev or TemplateRevision of its template, default the latest.
	StackID          string `json:"stackId,omitempty"`
	TemplateRevision int    `json:"templateRevision,omitempty"` // = Rev (stack.update's name for it)
	// Credentials maps a provider to the credential to use; default: the team's only one.
	Credentials map[string]string `json:"credentials,omitempty"`
	// Variables are values for the template's variables.
	Variables map[string]string `json:"variables,omitempty"`
	Title     string            `json:"title,omitempty"` // stack.create only
	// Parameters are typed values (JSON) of the template's parameters (template.parameters);
	// names that are no parameter are refused.
	Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
	// Preset names the template preset whose values apply under Parameters and Variables;
	// absent: the template's default preset, if it has one; "": no preset.
	Preset *string `json:"preset,omitempty"`
}

// Validate implements kite.Validator.
func (p *StackPlanParams) Validate() error {
	if p.StackID != "" {
		return p.validateStack()
	}
	return required("templateId", p.TemplateID)
}

// PlannedMachine is a machine a template would create.
type PlannedMachine struct {
	Label      string         `json:"label"`
	Provider   string         `json:"provider"`
	Resource   string         `json:"resource"`
	Index      *int           `json:"index,omitempty"`
	Attributes map[string]any `json:"attributes,omitempty"`
	// Configured names the attributes (and blocks) the template sets; Attributes also hold the
	// provider's defaults. Empty from a kloud before it.
	Configured []string `json:"configured,omitempty"`
}

// StackPlanResult is the result of stack.plan.
type StackPlanResult struct {
	Machines   []PlannedMachine `json:"machines"`
	TemplateID string           `json:"templateId"`
	Rev        int              `json:"rev"`
	// Update is set when a stack was planned (StackPlanParams.StackID): what an update would do.
	Update *StackUpdatePlan `json:"update,omitempty"`
}

// PlanJobResult decodes the result of a stack.planJob job (JobEvent.Result, Job.Result).
func PlanJobResult(result map[string]any) (StackPlanResult, error) {
	var r StackPlanResult
	b, err := json.Marshal(result)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil {
		return r, fmt.Errorf("plan job result: %w", err)
	}
	return r, nil
}

// StackCreateResult is the result of stack.create.
type StackCreateResult struct {
	Stack    model.Stack     `json:"stack"`
	Machines []model.Machine `json:"machines"`
	// Claimed: the stack is a prebuilt one, taken from the template's pool: built already, its
	// machines being handed to the caller (a stack.claim job; no stack.apply needed).
	Claimed bool `json:"claimed,omitempty"`
	// JobID is a claimed stack's stack.claim job (job.watch follows it).
	JobID string `json:"jobId,omitempty"`
}

// StackApplyParams are the params of stack.apply.
type StackApplyParams struct {
	StackID string `json:"stackId"`
	Destroy bool   `json:"destroy,omitempty"`
}

// Validate implements kite.Validator.
func (p *StackApplyParams) Validate() error { return required("stackId", p.StackID) }

// StackView is a stack with its machines: the result of stack.describe and stack.reset.
type StackView struct {
	model.Stack
	MachineDocs []model.Machine `json:"machineDocs"`
	// Resets are the administrators' stack.reset calls on this stack, oldest first.
	Resets []model.StackReset `json:"resets,omitempty"`
}

// StackListParams filter stack.list.
type StackListParams struct {
	Team string `json:"team,omitempty"`
	All  bool   `json:"all,omitempty"` // team admins: every member's stacks
}

// StackListResult is the result of stack.list.
type StackListResult struct {
	Stacks []model.Stack `json:"stacks"`
}

// StackResetParams are the params of stack.reset.
type StackResetParams struct {
	StackID string `json:"stackId"`
	// State is Failed (default) or NotInitialized (only if nothing was ever built).
	State  string `json:"state,omitempty"`
	Reason string `json:"reason"`
}

// Validate implements kite.Validator.
func (p *StackResetParams) Validate() error {
	if p.StackID == "" {
		return errors.New("stackId is required")
	}
	if p.State == "" {
		p.State = model.StackFailed
	}
	if p.State != model.StackFailed && p.State != model.StackNotInitialized {
		return fmt.Errorf("state must be %s or %s, not %q", model.StackFailed, model.StackNotInitialized, p.State)
	}
	p.Reason = strings.TrimSpace(p.Reason)
	if p.Reason == "" {
		return errors.New("reason is required (it is kept on the stack and logged)")
	}
	if len(p.Reason) > 1000 {
		return errors.New("reason is longer than 1000 characters")
	}
	return nil
}
