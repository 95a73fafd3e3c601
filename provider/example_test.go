package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/provider"
)

// A credential of the example provider: json names and kloud tags make its form.
type exampleCredential struct {
	Token  string `json:"token" kloud:"API token,secret,required"`
	Region string `json:"region" kloud:"Region" default:"eu-1"`
}

// exampleStack is what the provider does for a stack; a real provider rewrites the template
// (BaseStack.InjectUserData) and checks the credential against its cloud.
type exampleStack struct{ base *provider.BaseStack }

func (s exampleStack) VerifyCredential(_ context.Context, c *provider.Credential) error {
	if c.Value.(*exampleCredential).Token == "" {
		return errors.New("empty token")
	}
	return nil
}

func (s exampleStack) BootstrapTemplates(context.Context, *provider.Credential) ([]*provider.Template, error) {
	return nil, nil // nothing to create once per credential
}

func (s exampleStack) ApplyTemplate(context.Context, *provider.Credential) (*provider.Template, error) {
	return s.base.Template, nil
}

// A minimal provider value, registered in a Registry (the value kloud.Options.Providers takes),
// found by name and by resource type, and described as provider.describe shows it.
func Example() {
	p := &provider.Provider{
		Name:         "example",
		ResourceType: "example_machine",
		Description:  "machines of the example cloud",
		Schema: provider.Schema{
			NewCredential: func() any { return new(exampleCredential) },
		},
		Stack: func(b *provider.BaseStack) (provider.Stack, error) { return exampleStack{b}, nil },
		Machine: func(*provider.BaseMachine) (provider.Machine, error) {
			return nil, errors.New("the example provider has no machines to start or stop")
		},
	}
	reg := provider.NewRegistry()
	reg.Register(p)

	found, err := reg.Lookup("example")
	if err != nil {
		panic(err)
	}
	fmt.Println(found.Name, found.UserDataAttr) // Register fills the cloud-init attribute's default
	fmt.Println(reg.ByResourceType("example_machine") == p)
	_, err = reg.Lookup("aws")
	fmt.Println(err)

	// A credential as kloud decodes it: validated against the part's JSON Schema, defaults
	// filled, required fields checked.
	v, err := p.DecodePart(context.Background(), provider.PartCredential, json.RawMessage(`{"token":"t0k"}`), nil)
	if err != nil {
		panic(err)
	}
	st, _ := p.Stack(&provider.BaseStack{Provider: p})
	fmt.Println(v.(*exampleCredential).Region, st.VerifyCredential(context.Background(), &provider.Credential{Value: v}))

	_, err = p.DecodePart(context.Background(), provider.PartCredential, json.RawMessage(`{"region":"eu-2"}`), nil)
	fmt.Println(err)

	d := provider.Describe(p)
	fmt.Println(d.Kind, d.Capabilities) // derived: the machine constructor fails, so no optional ones
	fmt.Println(string(d.Schemas.Credential))
	// Output:
	// example user_data
	// true
	// unknown provider "aws" (this kloud does not offer it)
	// eu-1 <nil>
	// field token (API token) is required
	// builtin [info start stop]
	// {"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"token":{"type":"string","title":"API token","minLength":1,"writeOnly":true,"propertyOrder":0},"region":{"type":"string","title":"Region","default":"eu-1","propertyOrder":1}},"required":["token"],"additionalProperties":false}
}
