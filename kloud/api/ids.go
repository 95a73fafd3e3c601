package api

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Ref types name one thing in params (and JobRef is also the result of the methods that start
// a job). Each accepts the thing's old param name id for one release where it was named so.

// StackRef names a stack: the params of stack.describe.
type StackRef struct {
	StackID string `json:"stackId"`
}

// MachineRef names a machine: the params of machine.info, start, stop and shares.
type MachineRef struct {
	MachineID string `json:"machineId"`
}

// TemplateRef names a template: the params of template.delete.
type TemplateRef struct {
	TemplateID string `json:"templateId"`
}

// CredentialRef names a credential: the params of credential.describe, remove and
// authenticate.
type CredentialRef struct {
	CredentialID string `json:"credentialId"`
}

// JobRef names a job: the params of job.get, watch and cancel, and the result of stack.apply,
// machine.start and machine.stop.
type JobRef struct {
	JobID string `json:"jobId"`
}

// Validate implements kite.Validator.
func (p *StackRef) Validate() error { return required("stackId", p.StackID) }

// Validate implements kite.Validator.
func (p *MachineRef) Validate() error { return required("machineId", p.MachineID) }

// Validate implements kite.Validator.
func (p *TemplateRef) Validate() error { return required("templateId", p.TemplateID) }

// Validate implements kite.Validator.
func (p *CredentialRef) Validate() error { return required("credentialId", p.CredentialID) }

// Validate implements kite.Validator.
func (p *JobRef) Validate() error { return required("jobId", p.JobID) }

// UnmarshalJSON accepts the old name id for stackId.
func (p *StackRef) UnmarshalJSON(b []byte) error {
	type plain StackRef
	return decodeRenamed(b, "stackId", (*plain)(p))
}

// UnmarshalJSON accepts the old name id for templateId.
func (p *TemplateRef) UnmarshalJSON(b []byte) error {
	type plain TemplateRef
	return decodeRenamed(b, "templateId", (*plain)(p))
}

// UnmarshalJSON accepts the old name id for credentialId.
func (p *CredentialRef) UnmarshalJSON(b []byte) error {
	type plain CredentialRef
	return decodeRenamed(b, "credentialId", (*plain)(p))
}

func required(name, v string) error {
	if v == "" {
		return errors.New(name + " is required")
	}
	return nil
}

// decodeRenamed decodes b strictly into v (unknown fields are errors, as kite's Bind makes
// them), reading a field "id" as name when name itself is absent: the param's name before
// the one id scheme (deprecated; accepted for one release).
func decodeRenamed(b []byte, name string, v any) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	if old, ok := m["id"]; ok {
		if _, both := m[name]; both {
			return errors.New("id and " + name + " name the same thing: send only " + name)
		}
		delete(m, "id")
		m[name] = old
		var err error
		if b, err = json.Marshal(m); err != nil {
			return err
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
