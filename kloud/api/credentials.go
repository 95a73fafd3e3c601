package api

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider/ptype"
)

// ProviderDescribeParams filter provider.describe.
type ProviderDescribeParams struct {
	Provider string `json:"provider,omitempty"`
}

// ProviderDescribeResult is the result of provider.describe.
type ProviderDescribeResult struct {
	Providers []ptype.Description `json:"providers"`
}

// CredentialAddParams are the params of credential.add.
type CredentialAddParams struct {
	Provider string          `json:"provider"`
	Title    string          `json:"title"`
	Team     string          `json:"team,omitempty"` // default: the caller's only team
	Data     json.RawMessage `json:"data,omitempty"` // the provider's credential fields
}

// Validate implements kite.Validator.
func (p *CredentialAddParams) Validate() error {
	p.Title = strings.TrimSpace(p.Title)
	switch {
	case p.Provider == "":
		return errors.New("provider is required")
	case p.Title == "":
		return errors.New("title is required")
	case len(p.Title) > 100:
		return errors.New("title: at most 100 bytes")
	}
	return nil
}

// CredentialAddResult is the result of credential.add: the new credential's id (a document's
// id, hence id).
type CredentialAddResult struct {
	ID string `json:"id"`
}

// CredentialUpdateParams are the params of credential.update: a change to a credential's value
// (a JSON merge patch of the provider's fields). A field given replaces the stored one; a field
// left out keeps its stored value (so secrets need not be sent again); a field set to null goes
// back to its default (or empty). The merged value is validated against the provider's schema
// with the old value: fields marked immutable cannot change.
type CredentialUpdateParams struct {
	CredentialID string          `json:"credentialId"`
	Data         json.RawMessage `json:"data"`
}

// Validate implements kite.Validator.
func (p *CredentialUpdateParams) Validate() error {
	if err := required("credentialId", p.CredentialID); err != nil {
		return err
	}
	var m map[string]any
	if len(p.Data) == 0 || json.Unmarshal(p.Data, &m) != nil || m == nil {
		return errors.New("data must be a JSON object of the fields to change")
	}
	return nil
}

// CredentialUpdateResult is the result of credential.update.
type CredentialUpdateResult struct {
	ID string `json:"id"`
	// Changed lists the fields whose value changed, sorted (secret ones by name only).
	Changed []string `json:"changed"`
}

// CredentialListParams filter credential.list.
type CredentialListParams struct {
	Provider string `json:"provider,omitempty"`
	Team     string `json:"team,omitempty"`
}

// CredentialListResult is the result of credential.list.
type CredentialListResult struct {
	Credentials []model.Credential `json:"credentials"`
}

// CredentialField is one field of a described credential. Value is set for non-secret fields
// only; for secret ones, Set says whether they have a value.
type CredentialField struct {
	ptype.Field
	Set   bool `json:"set"`
	Value any  `json:"value,omitempty"`
}

// CredentialView is the result of credential.describe.
type CredentialView struct {
	model.Credential
	Fields []CredentialField `json:"fields"`
}

// CredentialRemoveResult is the result of credential.remove.
type CredentialRemoveResult struct {
	ID      string `json:"id"`
	Removed bool   `json:"removed"`
}

// AuthenticateResult is the result of credential.authenticate.
type AuthenticateResult struct {
	ID       string `json:"id"`
	Verified bool   `json:"verified"`
	Error    string `json:"error,omitempty"` // why the provider rejected it
}

// CredentialBootstrapParams are the params of credential.bootstrap.
type CredentialBootstrapParams struct {
	CredentialID string `json:"credentialId"`
	Destroy      bool   `json:"destroy,omitempty"`
}

// Validate implements kite.Validator.
func (p *CredentialBootstrapParams) Validate() error { return required("credentialId", p.CredentialID) }

// UnmarshalJSON accepts the old name id for credentialId.
func (p *CredentialBootstrapParams) UnmarshalJSON(b []byte) error {
	type plain CredentialBootstrapParams
	return decodeRenamed(b, "credentialId", (*plain)(p))
}

// BootstrapResult is the result of credential.bootstrap.
type BootstrapResult struct {
	JobID  string `json:"jobId"`
	Status string `json:"status"` // the bootstrap status now
	// AlreadyDone is set when the credential was bootstrapped before (JobID is that job).
	AlreadyDone bool `json:"alreadyDone,omitempty"`
}
