package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// Stack update and scale (issue 13 §1): stack.update, stack.scale, and stack.plan of a stack.

// Actions of a machine in a stack update (MachineChange.Action).
const (
	UpdateAdd     = "add"     // a new machine: created, its agent awaited
	UpdateChange  = "change"  // changed in place: keeps its disk, agent and sessions
	UpdateReplace = "replace" // destroyed and created again (new disk, new agent)
	UpdateRemove  = "remove"  // destroyed, its record removed
	UpdateKeep    = "keep"    // untouched
)

// StackUpdateParams are the params of stack.update.
type StackUpdateParams struct {
	StackID string `json:"stackId"`
	// TemplateRevision to update to; default: the template's latest.
	TemplateRevision int `json:"templateRevision,omitempty"`
	// Parameters change parameter values (JSON) of the stack; a parameter that is not mutable
	// cannot change once the stack is built.
	Parameters map[string]json.RawMessage `json:"parameters,omitempty"`
}

// Validate implements kite.Validator.
func (p *StackUpdateParams) Validate() error {
	if err := required("stackId", p.StackID); err != nil {
		return err
	}
	if p.TemplateRevision < 0 {
		return fmt.Errorf("templateRevision %d: revisions start at 1 (leave it out for the latest)", p.TemplateRevision)
	}
	return nil
}

func (p *StackPlanParams) validateStack() error {
	if p.TemplateID != "" {
		return errors.New("give stackId (plan an update of the stack) or templateId (plan a template), not both")
	}
	if p.Title != "" {
		return errors.New("title is for stack.create, not for planning a stack's update")
	}
	if len(p.Credentials) > 0 || len(p.Variables) > 0 || len(p.Parameters) > 0 || p.Preset != nil {
		return errors.New("a stack's update uses the stack's own credentials and variables: leave credentials and variables out")
	}
	if p.Rev < 0 || p.TemplateRevision < 0 {
		return errors.New("revisions start at 1 (leave rev out for the latest)")
	}
	if p.Rev != 0 && p.TemplateRevision != 0 && p.Rev != p.TemplateRevision {
		return fmt.Errorf("rev %d and templateRevision %d differ: give one", p.Rev, p.TemplateRevision)
	}
	if p.Rev == 0 {
		p.Rev = p.TemplateRevision
	}
	return nil
}

// resourceNameRe is Terraform's identifier syntax.
var resourceNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// MaxScale bounds stack.scale's count.
const MaxScale = 100

// StackScaleParams are the params of stack.scale.
type StackScaleParams struct {
	StackID string `json:"stackId"`
	// Resource is the name of a machine resource of the stack's files (e.g. "vm" of
	// resource "kloudlocal_machine" "vm"); its count must be a literal or a variable.
	Resource string `json:"resource"`
	Count    int    `json:"count"`
}

// Validate implements kite.Validator.
func (p *StackScaleParams) Validate() error {
	if err := required("stackId", p.StackID); err != nil {
		return err
	}
	if !resourceNameRe.MatchString(p.Resource) {
		return fmt.Errorf("resource %q: give the name of a machine resource of the stack (as in resource \"TYPE\" \"NAME\")", p.Resource)
	}
	if p.Count < 0 || p.Count > MaxScale {
		return fmt.Errorf("count %d: between 0 and %d", p.Count, MaxScale)
	}
	return nil
}

// AttrChange is one attribute a stack update changes on a machine. Hidden attributes (user
// data: it holds the agent's key) are named without their values.
type AttrChange struct {
	Name   string `json:"name"`
	Before any    `json:"before,omitempty"`
	After  any    `json:"after,omitempty"`
	// Unknown: the new value is known only after apply.
	Unknown bool `json:"unknown,omitempty"`
	Hidden  bool `json:"hidden,omitempty"`
}

// String is the change as the CLI and the update job's log show it: `name: before → after`,
// `name: before → (known after apply)` or `name (hidden)`; strings quoted, other values as JSON.
func (c AttrChange) String() string {
	switch {
	case c.Hidden:
		return c.Name + " (hidden)"
	case c.Unknown:
		return c.Name + ": " + valueText(c.Before) + " → (known after apply)"
	}
	return c.Name + ": " + valueText(c.Before) + " → " + valueText(c.After)
}

func valueText(v any) string {
	if v == nil {
		return "null"
	}
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// MachineChange is what a stack update does to one machine.
type MachineChange struct {
	Label     string `json:"label"`
	Provider  string `json:"provider"`
	Resource  string `json:"resource"`
	MachineID string `json:"machineId,omitempty"` // the existing machine (not for add)
	Action    string `json:"action"`              // add, change, replace, remove, keep
	// Changes are the attributes that change (change, replace).
	Changes []AttrChange `json:"changes,omitempty"`
	// Attributes of a machine to add, as planned; Configured names those the template sets
	// (PlannedMachine.Configured).
	Attributes map[string]any `json:"attributes,omitempty"`
	Configured []string       `json:"configured,omitempty"`
}

// StackUpdatePlan is what stack.update would do to a stack (StackPlanResult.Update).
type StackUpdatePlan struct {
	StackID  string          `json:"stackId"`
	FromRev  int             `json:"fromRev"`
	ToRev    int             `json:"toRev"`
	Diverged bool            `json:"diverged,omitempty"` // the stack's files are not FromRev's (scaled)
	Machines []MachineChange `json:"machines"`
	// Summary counts the machines per action.
	Summary map[string]int `json:"summary"`
}
