package ptype_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// hostVocab is a vocabulary like the local provider's, on a host with 7963 MB and 2 CPUs.
func hostVocab() []ptype.Constraint {
	return []ptype.Constraint{
		{Name: ptype.ConstraintCores, Attribute: "cpus", Type: ptype.ConstraintNumber, Unit: "CPUs", Min: ptype.Bounds(0.01), Max: ptype.Bounds(2), Bound: "this host"},
		{Name: ptype.ConstraintMem, Attribute: "memory", Type: ptype.ConstraintInteger, Unit: "MB", Min: ptype.Bounds(32), Max: ptype.Bounds(7963), Bound: "this host"},
		{Name: ptype.ConstraintArch, Type: ptype.ConstraintString, Values: []string{"amd64"}},
		{Name: ptype.ConstraintZone, Attribute: "zone", Type: ptype.ConstraintString, Values: []string{"eu-west-1a", "eu-west-1b"}},
		{Name: ptype.ConstraintTags, Attribute: "tags", Type: ptype.ConstraintMap},
		{Name: ptype.ConstraintInstanceType, Attribute: "instance_type", Type: ptype.ConstraintString, Values: []string{"small", "large"},
			Conflicts: []string{ptype.ConstraintCores, ptype.ConstraintMem}},
	}
}

func TestValidateConstraints(t *testing.T) {
	vocab := hostVocab()
	if err := ptype.CheckVocabulary(vocab); err != nil {
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
			err := ptype.ValidateConstraints(vocab, attrs)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ValidateConstraints(%s): %v, want nil", tc.attrs, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ValidateConstraints(%s): %v, want %q", tc.attrs, err, tc.want)
			}
			if !errors.Is(err, ptype.ErrConstraint) {
				t.Errorf("error %v does not wrap ErrConstraint", err)
			}
			var ce *ptype.ConstraintError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *ConstraintError", err)
			}
			if ce.Nearest != tc.nearest {
				t.Errorf("nearest %#v, want %#v", ce.Nearest, tc.nearest)
			}
			if tc.nearest != nil {
				// The nearest value is valid.
				c := ptype.LookupConstraint(vocab, ce.Constraint)
				if err := c.Check(ce.Nearest); err != nil {
					t.Errorf("the nearest value %v is not valid: %v", ce.Nearest, err)
				}
			}
			t.Logf("%v", err)
		})
	}
	// Several violations are all reported.
	err := ptype.ValidateConstraints(vocab, map[string]any{"memory": 1e6, "cpus": 64.0})
	if err == nil || !strings.Contains(err.Error(), "mem (memory)") || !strings.Contains(err.Error(), "cores (cpus)") {
		t.Errorf("two violations: %v", err)
	}
	// A conflict is reported once, whichever side declares it.
	err = ptype.ValidateConstraints(vocab, map[string]any{"instance_type": "small", "memory": 512.0, "cpus": 1.0})
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
	vocab := append(hostVocab(), ptype.Constraint{Name: "groups", Attribute: "groups", Type: ptype.ConstraintList, Values: []string{"dev", "ops"}})
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
			err := ptype.ValidateConstraints(vocab, tc.attrs)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ValidateConstraints(%v): %v, want nil", tc.attrs, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ptype.ErrConstraint) {
				t.Fatalf("ValidateConstraints(%v): %v, want a constraint error saying %q", tc.attrs, err, tc.want)
			}
		})
	}
}

func TestCheckVocabulary(t *testing.T) {
	for _, tc := range []struct {
		vocab []ptype.Constraint
		want  string
	}{
		{[]ptype.Constraint{{Attribute: "x", Type: ptype.ConstraintString}}, "without a name"},
		{[]ptype.Constraint{{Name: "mem", Type: ptype.ConstraintInteger}, {Name: "mem", Type: ptype.ConstraintInteger}}, "declared twice"},
		{[]ptype.Constraint{{Name: "mem", Type: "bytes"}}, `type "bytes"`},
		{[]ptype.Constraint{{Name: "mem", Type: ptype.ConstraintInteger, Min: ptype.Bounds(10), Max: ptype.Bounds(1)}}, "min 10 is above max 1"},
		{[]ptype.Constraint{{Name: "instance-type", Type: ptype.ConstraintString, Conflicts: []string{"cores"}}}, "does not have"},
	} {
		if err := ptype.CheckVocabulary(tc.vocab); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckVocabulary(%+v): %v, want %q", tc.vocab, err, tc.want)
		}
	}
}
