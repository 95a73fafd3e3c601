package provider_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
)

// hostVocab is a vocabulary like the local provider's, on a host with 7963 MB and 2 CPUs.
func hostVocab() []provider.Constraint {
	return []provider.Constraint{
		{Name: provider.ConstraintCores, Attribute: "cpus", Type: provider.ConstraintNumber, Unit: "CPUs", Min: provider.Bounds(0.01), Max: provider.Bounds(2), Bound: "this host"},
		{Name: provider.ConstraintMem, Attribute: "memory", Type: provider.ConstraintInteger, Unit: "MB", Min: provider.Bounds(32), Max: provider.Bounds(7963), Bound: "this host"},
		{Name: provider.ConstraintArch, Type: provider.ConstraintString, Values: []string{"amd64"}},
		{Name: provider.ConstraintZone, Attribute: "zone", Type: provider.ConstraintString, Values: []string{"eu-west-1a", "eu-west-1b"}},
		{Name: provider.ConstraintTags, Attribute: "tags", Type: provider.ConstraintMap},
		{Name: provider.ConstraintInstanceType, Attribute: "instance_type", Type: provider.ConstraintString, Values: []string{"small", "large"},
			Conflicts: []string{provider.ConstraintCores, provider.ConstraintMem}},
	}
}

func TestValidateConstraints(t *testing.T) {
	vocab := hostVocab()
	if err := provider.CheckVocabulary(vocab); err != nil {
		t.Fatalf("CheckVocabulary of a good vocabulary: %v", err)
	}
	for _, tc := range []struct {
		name    string
		attrs   string // JSON, as a plan's attributes
		want    string // substring of the error; "" for none
		nearest any
	}{
		{"within range", `{"memory":512,"cpus":1.5,"hostname":"x","tags":{"a":"b"}}`, "", nil},
		{"unset and null are not checked", `{"memory":null}`, "", nil},
		{"memory above the host", `{"memory":100000}`, "mem (memory) 100000 MB is more than the 7963 MB this host allows (allowed: 32-7963 MB); nearest valid: 7963", int64(7963)},
		{"memory below the minimum", `{"memory":8}`, "is less than the 32 MB this host allows", int64(32)},
		{"memory not whole", `{"memory":100.4}`, "is not a whole number", int64(100)},
		{"cpus above the host", `{"cpus":3.5}`, "cores (cpus) 3.5 CPUs is more than the 2 CPUs this host allows", 2.0},
		{"cpus not a number", `{"cpus":"many"}`, "is not a number", nil},
		{"zone not offered", `{"zone":"EU-west-1B"}`, `zone "EU-west-1B" is not one of eu-west-1a, eu-west-1b`, "eu-west-1b"},
		{"zone typo", `{"zone":"eu-wst-1a"}`, "nearest valid: \"eu-west-1a\"", "eu-west-1a"},
		{"tags not strings", `{"tags":{"a":1}}`, "has a = 1, which is not a string", nil},
		{"conflict", `{"instance_type":"small","memory":512}`, "conflicts with", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var attrs map[string]any
			if err := json.Unmarshal([]byte(tc.attrs), &attrs); err != nil {
				t.Fatal(err)
			}
			err := provider.ValidateConstraints(vocab, attrs)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ValidateConstraints(%s): %v, want nil", tc.attrs, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ValidateConstraints(%s): %v, want %q", tc.attrs, err, tc.want)
			}
			if !errors.Is(err, provider.ErrConstraint) {
				t.Errorf("error %v does not wrap ErrConstraint", err)
			}
			var ce *provider.ConstraintError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *ConstraintError", err)
			}
			if ce.Nearest != tc.nearest {
				t.Errorf("nearest %#v, want %#v", ce.Nearest, tc.nearest)
			}
			if tc.nearest != nil {
				// The nearest value is valid.
				c := provider.LookupConstraint(vocab, ce.Constraint)
				if err := c.Check(ce.Nearest); err != nil {
					t.Errorf("the nearest value %v is not valid: %v", ce.Nearest, err)
				}
			}
			t.Logf("%v", err)
		})
	}
	// Several violations are all reported.
	err := provider.ValidateConstraints(vocab, map[string]any{"memory": 1e6, "cpus": 64.0})
	if err == nil || !strings.Contains(err.Error(), "mem (memory)") || !strings.Contains(err.Error(), "cores (cpus)") {
		t.Errorf("two violations: %v", err)
	}
	// A conflict is reported once, whichever side declares it.
	err = provider.ValidateConstraints(vocab, map[string]any{"instance_type": "small", "memory": 512.0, "cpus": 1.0})
	if n := strings.Count(err.Error(), "conflicts with"); n != 2 {
		t.Errorf("instance-type with mem and cores: %d conflicts reported, want 2: %v", n, err)
	}
}

// storeDoc and storeArray are how a document store's driver decodes a machine's recorded
// attributes (bson.M and bson.A are such named types): not map[string]any and []any.
type (
	storeDoc   map[string]any
	storeArray []any
)

// TestValidateConstraintsOfRecordedValues: a machine's attributes as kloud reads them back from
// its store after a build (kloud's own tags among the template's, in the driver's named map
// type) are a map of strings; values that really are not a map or a list (a string holding
// JSON, a number) are still refused, as are non-string values in such a map.
func TestValidateConstraintsOfRecordedValues(t *testing.T) {
	vocab := append(hostVocab(), provider.Constraint{Name: "groups", Attribute: "groups", Type: provider.ConstraintList, Values: []string{"dev", "ops"}})
	stateTags := storeDoc{"kloud_machine": "6a1f", "kloud_owner": "admin", "kloud_stack": "5e2c", "kloud_team": "default", "team": "a"}
	for _, tc := range []struct {
		name  string
		attrs map[string]any
		want  string // substring of the error; "" for none
	}{
		{"tags read back from the store", map[string]any{"tags": stateTags, "memory": int32(512)}, ""},
		{"tags as map[string]string", map[string]any{"tags": map[string]string{"team": "a"}}, ""},
		{"a list read back from the store", map[string]any{"groups": storeArray{"dev"}}, ""},
		{"a list as []string", map[string]any{"groups": []string{"ops", "dev"}}, ""},
		{"tags that are a string of JSON", map[string]any{"tags": `{"team":"a"}`}, "is not a map"},
		{"tags that are a number", map[string]any{"tags": 3.0}, "is not a map"},
		{"tags read back with a number", map[string]any{"tags": storeDoc{"team": int64(1)}}, "has team = 1, which is not a string"},
		{"a list read back with a value not allowed", map[string]any{"groups": storeArray{"qa"}}, `has "qa", which is not one of dev, ops`},
		{"a list that is a string", map[string]any{"groups": "dev"}, "is not a list"},
		{"bytes are not a list", map[string]any{"groups": []byte("dev")}, "is not a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := provider.ValidateConstraints(vocab, tc.attrs)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ValidateConstraints(%v): %v, want nil", tc.attrs, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, provider.ErrConstraint) {
				t.Fatalf("ValidateConstraints(%v): %v, want a constraint error saying %q", tc.attrs, err, tc.want)
			}
		})
	}
}

func TestCheckVocabulary(t *testing.T) {
	for _, tc := range []struct {
		vocab []provider.Constraint
		want  string
	}{
		{[]provider.Constraint{{Attribute: "x", Type: provider.ConstraintString}}, "without a name"},
		{[]provider.Constraint{{Name: "mem", Type: provider.ConstraintInteger}, {Name: "mem", Type: provider.ConstraintInteger}}, "declared twice"},
		{[]provider.Constraint{{Name: "mem", Type: "bytes"}}, `type "bytes"`},
		{[]provider.Constraint{{Name: "mem", Type: provider.ConstraintInteger, Min: provider.Bounds(10), Max: provider.Bounds(1)}}, "min 10 is above max 1"},
		{[]provider.Constraint{{Name: "instance-type", Type: provider.ConstraintString, Conflicts: []string{"cores"}}}, "does not have"},
	} {
		if err := provider.CheckVocabulary(tc.vocab); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckVocabulary(%+v): %v, want %q", tc.vocab, err, tc.want)
		}
	}
}

func TestDescribeShowsConstraints(t *testing.T) {
	p := &provider.Provider{Name: "x", ResourceType: "x_machine", Constraints: hostVocab}
	d := provider.Describe(p)
	if len(d.Constraints) != len(hostVocab()) || d.Constraints[1].Name != provider.ConstraintMem {
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
