package provider

import (
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

// The Terraform providers a kloud provider offers to stack templates, for the template policy
// (tmpl.Policy, docs/template-policy.md).

// TerraformProvider is a Terraform provider (or the subset of Terraform's built-in provider)
// templates may use: its local name, source, resource and data source types, and the provider
// block arguments a user may set.
type TerraformProvider = tmpl.AllowedProvider

// DeclareTerraform sets the Terraform providers p offers to templates (p.Terraform), replacing
// the default TerraformProviders derives from p.ResourceType, and returns p. Call it before
// registering p.
func DeclareTerraform(p *Provider, tps ...TerraformProvider) *Provider {
	if tps == nil {
		tps = []TerraformProvider{}
	}
	p.Terraform = tps
	return p
}

// TerraformProviders returns the Terraform providers p offers to templates: what
// DeclareTerraform set or, by default, the provider of p's machine resource type:
//   - "terraform_<x>" (a built-in, like the dummy's terraform_data): that one type of
//     Terraform's built-in provider, nothing else of it (not terraform_remote_state);
//   - "<name>_<x>": every "<name>_*" type of the Terraform provider "<name>" from source
//     "kloud/<name>" (kloud's own providers are published under kloud/, like kloud/kloudlocal),
//     configured by kloud (a user's provider block may only be empty).
func (p *Provider) TerraformProviders() []TerraformProvider {
	if p.Terraform != nil {
		return p.Terraform
	}
	name, _, found := strings.Cut(p.ResourceType, "_")
	switch {
	case !found || name == "":
		return nil
	case name == "terraform":
		return []TerraformProvider{{Name: "terraform", Types: []string{p.ResourceType}}}
	}
	return []TerraformProvider{{Name: name, Source: "kloud/" + name}}
}

// TemplatePolicy returns the template policy for the providers of r: resources, data sources,
// provider blocks and functions of the Terraform providers they offer; lift lists rule ids not
// enforced (a trusted template).
func (r *Registry) TemplatePolicy(lift ...string) tmpl.Policy {
	var pol tmpl.Policy
	seen := map[string]int{}
	for _, n := range r.Names() {
		p, err := r.Lookup(n)
		if err != nil {
			continue
		}
		for _, tp := range p.TerraformProviders() {
			i, dup := seen[tp.Name]
			tp.Types = slices.Clone(tp.Types) // appended to below
			if !dup {
				seen[tp.Name] = len(pol.Providers)
				pol.Providers = append(pol.Providers, tp)
				continue
			}
			// Two kloud providers offering parts of one Terraform provider (two dummies, say):
			// the union of their types.
			cur := &pol.Providers[i]
			if tp.Types == nil {
				cur.Types = nil
			}
			for _, t := range tp.Types {
				if cur.Types != nil && !slices.Contains(cur.Types, t) {
					cur.Types = append(cur.Types, t)
				}
			}
		}
	}
	pol.Lift = append(pol.Lift, lift...)
	return pol
}
