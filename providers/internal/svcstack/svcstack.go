// Package svcstack is the part of a provider.Stack that the providers whose machines a machine
// service of kloud's creates (providers/local, providers/vagrant: machinesvc.Template) share: no
// credential but a check that kloud can serve the machines, nothing to bootstrap, and templates
// rewritten and validated by the provider's machinesvc.Template. Start reading at Stack.
package svcstack

import (
	"context"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/machinesvc"
)

// Stack is embedded in such a provider's stack, which adds what is its own.
type Stack struct {
	// B is the stack being built.
	B *provider.BaseStack
	// Available is the provider's check that its machines can be served here (the credential).
	Available func() error
	// Template is how the provider rewrites templates.
	Template func() *machinesvc.Template
}

// VerifyCredential: such a provider takes no credential; it checks that kloud can serve its
// machines (Available).
func (s *Stack) VerifyCredential(ctx context.Context, c *provider.Credential) error {
	return s.Available()
}

// BootstrapTemplates: nothing to bootstrap.
func (s *Stack) BootstrapTemplates(ctx context.Context, c *provider.Credential) ([]*provider.Template, error) {
	return nil, nil
}

// ApplyTemplate rewrites the stack's template (machinesvc.Template.Apply): every machine resource
// gets its agent's cloud-init and kloud's tags, and the template gets the provider's Terraform
// provider configured for kloud's machine service: the endpoint, and a token for this stack that
// may create exactly B.Machines.
//
// With no Machines (a destroy, or a refresh) it only configures the provider: the token may then
// read, retag and destroy the stack's machines but create none, and no agent key is minted.
func (s *Stack) ApplyTemplate(ctx context.Context, c *provider.Credential) (*provider.Template, error) {
	return s.Template().Apply(ctx, s.B)
}

// ValidateTemplate is provider.TemplateValidator: the static rules of its templates
// (machinesvc.Template.Validate), which kloud checks at template.create and template.update,
// stack.plan and stack.create, stack.apply and the build (and logs before a destroy).
func (s *Stack) ValidateTemplate(ctx context.Context, files map[string][]byte) ([]provider.TemplateFinding, error) {
	return s.Template().Validate(files)
}

var _ provider.TemplateValidator = (*Stack)(nil)
