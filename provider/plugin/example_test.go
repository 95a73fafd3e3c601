package plugin_test

import (
	"context"
	"errors"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
	"github.com/kloud-dev/kloud/userdata"
)

type exampleCredential struct {
	Token string `json:"token" kloud:"API token,secret,required"`
}

type exampleStack struct{ b *provider.BaseStack }

func (s exampleStack) VerifyCredential(_ context.Context, c *provider.Credential) error {
	if c.Value.(*exampleCredential).Token != "open sesame" { // the plugin's own type, decoded
		return errors.New("the example cloud rejected the token")
	}
	return nil
}

func (s exampleStack) BootstrapTemplates(context.Context, *provider.Credential) ([]*provider.Template, error) {
	return nil, nil
}

func (s exampleStack) ApplyTemplate(ctx context.Context, _ *provider.Credential) (*provider.Template, error) {
	// kloud sent every machine's agent configuration; InjectUserData renders them.
	return s.b.Template, s.b.InjectUserData(ctx, func(_ *provider.MachineSpec, _ userdata.Config) ([]byte, error) {
		return []byte("#!/bin/sh\n"), nil
	})
}

// The main of a plugin binary, kloud-provider-example: the same *provider.Provider an in-tree
// provider registers, handed to plugin.Serve. Kloud launches it with KLOUD_PLUGIN_URL and
// KLOUD_PLUGIN_KEY set; run remotely, it takes -url and -key-file.
func ExampleServe() {
	plugin.Serve(&provider.Provider{
		Name:         "example",
		ResourceType: "example_machine",
		Description:  "machines of the example cloud",
		Schema:       provider.Schema{NewCredential: func() any { return new(exampleCredential) }},
		Stack:        func(b *provider.BaseStack) (provider.Stack, error) { return exampleStack{b}, nil },
		Machine: func(*provider.BaseMachine) (provider.Machine, error) {
			return nil, errors.New("no machines in this example")
		},
	})
}
