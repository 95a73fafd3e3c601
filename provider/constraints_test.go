package provider_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
)

func TestDescribeShowsConstraints(t *testing.T) {
	vocab := func() []provider.Constraint {
		return []provider.Constraint{
			{Name: provider.ConstraintCores, Attribute: "cpus", Type: provider.ConstraintNumber, Unit: "CPUs", Min: provider.Bounds(0.01), Max: provider.Bounds(2), Bound: "this host"},
			{Name: provider.ConstraintMem, Attribute: "memory", Type: provider.ConstraintInteger, Unit: "MB", Min: provider.Bounds(32), Max: provider.Bounds(7963), Bound: "this host"},
		}
	}
	p := &provider.Provider{Name: "x", ResourceType: "x_machine", Constraints: vocab}
	d := provider.Describe(p)
	if len(d.Constraints) != len(vocab()) || d.Constraints[1].Name != provider.ConstraintMem {
		t.Fatalf("describe: constraints %+v", d.Constraints)
	}
	b, _ := json.Marshal(d)
	if !strings.Contains(string(b), `"constraints":[{"name":"cores","attribute":"cpus","type":"number","unit":"CPUs","min":0.01,"max":2,"bound":"this host"}`) {
		t.Errorf("describe JSON: %s", b)
	}
	if d := provider.Describe(&provider.Provider{Name: "y"}); d.Constraints != nil {
		t.Errorf("describe of a provider without a vocabulary: %+v", d.Constraints)
	}
}
