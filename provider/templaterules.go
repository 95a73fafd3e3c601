package provider

import (
	"context"
	"errors"
	"fmt"
)

// A provider's own template rules: what its machine resources may not set (the docker
// provider's privileged, volumes, ports, ...) and the names it reserves for what it generates,
// checked on the template's files alone. kloud asks every provider a template uses (a machine
// resource of its type, or its Terraform provider named) wherever it checks the template policy
// (docs/template-policy.md): template.create and template.update (a refused template is not
// stored), stack.plan and stack.create (before terraform plans), stack.apply (before the build
// job starts) and the build job; before a destroy it only logs them (a destroy builds nothing,
// and a stack whose files break a rule added since it was built must still go). The
// provider's ApplyTemplate still checks the same rules at build time (and may check planned
// values behind them), so the messages a user sees at save and at build are the same.

// TemplateValidator is implemented by stacks whose provider has static rules for templates.
// kloud calls it on a Stack built from a BaseStack with only Provider, Team, Owner and Log set
// (no machines, no template): files are the user's template files, not rewritten. It returns
// one finding per place a rule refuses (in file order), or an error when it could not check
// (kloud then refuses the operation with that error: it never lets a template through
// unchecked). A template without the provider's resources has no findings.
type TemplateValidator interface {
	ValidateTemplate(ctx context.Context, files map[string][]byte) ([]TemplateFinding, error)
}

// TemplateFinding is one place of a template a provider's rule refuses, worded like the
// template policy's refusals (tmpl.PolicyError):
//
//	main.tf:4: docker_container.vm: privileged is not allowed (rule docker-argument): kloud's docker machines may set only ...
type TemplateFinding struct {
	File   string `json:"file"`
	Line   int    `json:"line"`
	Column int    `json:"column,omitempty"` // 0: not named
	// Construct names what was refused: "docker_container.vm: privileged", `variable "kloud_local_token"`.
	Construct string `json:"construct"`
	// Rule is the provider's rule id ("docker-argument", "reserved-name").
	Rule string `json:"rule"`
	// Detail says why, and what is allowed instead.
	Detail string `json:"detail"`
}

// Error is "file:line[:column]: construct is not allowed (rule R): detail".
func (f TemplateFinding) Error() string {
	pos := fmt.Sprintf("%s:%d", f.File, f.Line)
	if f.Column > 0 {
		pos += fmt.Sprintf(":%d", f.Column)
	}
	return fmt.Sprintf("%s: %s is not allowed (rule %s): %s", pos, f.Construct, f.Rule, f.Detail)
}

// JoinFindings is findings as one error (errors.Join: one line each), nil without any: what a
// provider's ApplyTemplate returns for the findings of its ValidateTemplate.
func JoinFindings(fs []TemplateFinding) error {
	errs := make([]error, len(fs))
	for i, f := range fs {
		errs[i] = f
	}
	return errors.Join(errs...)
}
