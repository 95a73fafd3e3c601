package provider_test

import (
	"reflect"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

func TestTemplatePolicy(t *testing.T) {
	r := provider.NewRegistry()
	r.Register(&provider.Provider{Name: "local", ResourceType: "kloudlocal_machine"})
	r.Register(&provider.Provider{Name: "dummy", ResourceType: "terraform_data"})
	r.Register(&provider.Provider{Name: "dummy2", ResourceType: "terraform_data"})
	r.Register(provider.DeclareTerraform(&provider.Provider{Name: "cloud", ResourceType: "acme_vm"},
		provider.TerraformProvider{Name: "acme", Source: "acme/acme", Types: []string{"acme_vm", "acme_network"}, ProviderArgs: []string{"region"}}))
	got := r.TemplatePolicy(tmpl.RuleProvisioner)
	want := tmpl.Policy{
		Providers: []tmpl.AllowedProvider{
			{Name: "acme", Source: "acme/acme", Types: []string{"acme_vm", "acme_network"}, ProviderArgs: []string{"region"}},
			{Name: "terraform", Types: []string{"terraform_data"}},
			{Name: "kloudlocal", Source: "kloud/kloudlocal"},
		},
		Lift: []string{tmpl.RuleProvisioner},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("policy\n got %+v\nwant %+v", got, want)
	}
}
