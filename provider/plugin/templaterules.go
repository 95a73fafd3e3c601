package plugin

import (
	"context"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// A provider's template rules on the plugin wire (capability "templateRules",
// provider.TemplateValidator): kloud's proxy stack sends the template's files (in the stack's
// template) to the plugin's provider.validateTemplate, whose stack must implement
// provider.TemplateValidator, and takes its findings back. kloud calls it at template.create and
// template.update, stack.plan, stack.apply and destroy, for templates that use the plugin's
// provider.
const MethodValidateTemplate = "provider.validateTemplate"

// Bounds on a plugin's findings, as kloud receives them (they become a user's error message).
const (
	maxFindings     = 256
	maxFindingField = 4096
)

// validateTemplateResult is provider.validateTemplate's result.
type validateTemplateResult struct {
	Findings []provider.TemplateFinding `json:"findings"`
}

var _ provider.TemplateValidator = (*proxyStack)(nil)

// ValidateTemplate asks the plugin for its findings in files; provider.ErrUnsupported unless
// the plugin advertised CapTemplateRules.
func (s *proxyStack) ValidateTemplate(ctx context.Context, files map[string][]byte) ([]provider.TemplateFinding, error) {
	if !s.can(provider.CapTemplateRules) {
		return nil, fmt.Errorf("provider %s: validate template: %w", s.name, provider.ErrUnsupported)
	}
	p, err := s.params(nil)
	if err != nil {
		return nil, err
	}
	p.Stack.Template = &wireTemplate{Files: files}
	var res validateTemplateResult
	if err := s.h.call(ctx, s.name, MethodValidateTemplate, p, &res); err != nil {
		return nil, err
	}
	if len(res.Findings) > maxFindings {
		return nil, fmt.Errorf("provider %s (plugin) returned %d template findings, at most %d", s.name, len(res.Findings), maxFindings)
	}
	for _, f := range res.Findings {
		if f.File == "" || f.Rule == "" || f.Construct == "" || f.Line < 0 || f.Column < 0 ||
			len(f.File) > maxFindingField || len(f.Rule) > maxFindingField || len(f.Construct) > maxFindingField || len(f.Detail) > maxFindingField {
			return nil, fmt.Errorf("provider %s (plugin) returned a malformed template finding (a file, a rule and a construct, each at most %d bytes): %.200q", s.name, maxFindingField, f.Error())
		}
	}
	return res.Findings, nil
}

func (s *server) validateTemplate(ctx context.Context, _ *kite.Request, p *stackParams) (any, error) {
	if p.Stack.Template == nil {
		return nil, fmt.Errorf("stack.template is required: %w", kite.ErrInvalidParams)
	}
	st, b, _, err := s.stack(p)
	if err != nil {
		return nil, err
	}
	tv, ok := st.(provider.TemplateValidator)
	if !ok {
		return nil, wireErr(fmt.Errorf("validate template: %w", provider.ErrUnsupported))
	}
	fs, err := tv.ValidateTemplate(ctx, b.Template.Files)
	if err != nil {
		return nil, wireErr(err)
	}
	if fs == nil {
		fs = []provider.TemplateFinding{}
	}
	return validateTemplateResult{Findings: fs}, nil
}
