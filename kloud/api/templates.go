package api

import (
	"errors"
	"github.com/kloud-dev/kloud/kloud/model"
)

// TemplateParams are the params of template.create and template.update.
type TemplateParams struct {
	TemplateID  string            `json:"templateId,omitempty"` // update only (old name: id)
	Title       string            `json:"title,omitempty"`
	Description string            `json:"description,omitempty"`
	Team        string            `json:"team,omitempty"` // create only; default: the caller's only team, or "default"
	Files       map[string]string `json:"files,omitempty"`
	// Trust (kloud administrators only) lifts template policy rules for the revision these
	// files make, as template.trust does for an existing revision; audited the same way.
	Trust *TrustSpec `json:"trust,omitempty"`
	// MaxMachines (update only, kloud administrators only) sets the template's cap on machines
	// per stack, 1 to kloud.MaxMachinesCeiling, in place of kloud's global cap.
	MaxMachines int `json:"maxMachines,omitempty"`
	// IdleTimeout and AlwaysOn (update only; the owner, team admins) set the idle stop of the
	// template's machines (kloud/idle.go): a duration, "0" (never) or "default" (kloud's); a
	// machine's own setting (machine.set) wins.
	IdleTimeout string `json:"idleTimeout,omitempty"`
	AlwaysOn    *bool  `json:"alwaysOn,omitempty"`
}

// UnmarshalJSON accepts the old name id for templateId.
func (p *TemplateParams) UnmarshalJSON(b []byte) error {
	type plain TemplateParams
	return decodeRenamed(b, "templateId", (*plain)(p))
}

// TrustSpec names the policy rules an administrator lifts, and why.
type TrustSpec struct {
	Rules  []string `json:"rules"`
	Reason string   `json:"reason"`
}

// TemplateGetParams are the params of template.get.
type TemplateGetParams struct {
	TemplateID string `json:"templateId"`
	Rev        int    `json:"rev,omitempty"` // default: the current revision
}

// Validate implements kite.Validator.
func (p *TemplateGetParams) Validate() error { return required("templateId", p.TemplateID) }

// UnmarshalJSON accepts the old name id for templateId.
func (p *TemplateGetParams) UnmarshalJSON(b []byte) error {
	type plain TemplateGetParams
	return decodeRenamed(b, "templateId", (*plain)(p))
}

// TemplateView is what template.get returns: the template (at the revision asked for) and the
// administrators' trust records of its revisions (template.trust).
type TemplateView struct {
	model.Template
	Trust []model.TemplateTrust `json:"trust,omitempty"`
}

// TemplateListParams filter template.list.
type TemplateListParams struct {
	Team string `json:"team,omitempty"`
}

// TemplateSummary is a template without its files.
type TemplateSummary struct {
	ID        string   `json:"id"`
	Title     string   `json:"title"`
	Team      string   `json:"team"`
	Owner     string   `json:"owner"`
	Rev       int      `json:"rev"`
	Providers []string `json:"providers"`
}

// TemplateListResult is the result of template.list.
type TemplateListResult struct {
	Templates []TemplateSummary `json:"templates"`
}

// DeleteResult is the result of template.delete.
type DeleteResult struct {
	Deleted bool `json:"deleted"`
}

// TrustParams are the params of template.trust and template.untrust.
type TrustParams struct {
	TemplateID string `json:"templateId"`
	// Revision to trust; default: the current one. template.untrust: default all revisions.
	Revision int      `json:"revision,omitempty"`
	Rules    []string `json:"rules,omitempty"`  // trust only: the rule ids to lift (kloud checks them)
	Reason   string   `json:"reason,omitempty"` // trust: required
}

// Validate implements kite.Validator.
func (p *TrustParams) Validate() error {
	if p.TemplateID == "" {
		return errors.New("templateId is required")
	}
	if p.Revision < 0 {
		return errors.New("revision must be positive")
	}
	return nil
}

// UntrustResult is the result of template.untrust.
type UntrustResult struct {
	TemplateID string `json:"templateId"`
	Removed    int    `json:"removed"`
}
