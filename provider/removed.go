package provider

import (
	"slices"
	"strings"
)

// ResourceOfLabel returns the Terraform resource name of machine label ("web" of "web" or
// "web.0", MachineSpec.Label).
func ResourceOfLabel(label string) string {
	res, _, _ := strings.Cut(label, ".")
	return res
}

// RemovedResources returns, sorted and once each, the machine resources a provider still has
// machines of (have: their labels) that declared (the resources of the machines ApplyTemplate
// renders now) does not hold: a stack update removed their whole block.
//
// A provider whose machines are destroyed by a destroy-time provisioner of a resource it
// generates needs them: Terraform runs a destroy-time provisioner only while the resource's
// block exists, so ApplyTemplate keeps the generated block of each removed resource, with no
// instances (count = 0) and the same provisioner, until the provider has no machine of it left
// (providers/dummy, examples/provider-example). A provider whose machines are resources of its
// own Terraform provider needs nothing: Terraform destroys those without a block.
func RemovedResources[V any](have []string, declared map[string]V) []string {
	var out []string
	for _, l := range have {
		res := ResourceOfLabel(l)
		if _, ok := declared[res]; !ok && res != "" && !slices.Contains(out, res) {
			out = append(out, res)
		}
	}
	slices.Sort(out)
	return out
}
