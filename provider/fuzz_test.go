package provider_test

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/providers/local"
)

// FuzzDecodePart decodes hostile provider options (credential and bootstrap values as a user
// or a template's outputs send them) with the in-tree providers' and a test type's schemas:
// DecodePart validates against the JSON Schema, then decodes strictly (defaults, required,
// Valid). Whatever the bytes, it must not panic, an error must not echo a secret that was sent,
// and a value it accepts must be accepted again, unchanged, when sent back (what kloud stores is
// what it would accept), including as an update of itself (immutable fields kept).
func FuzzDecodePart(f *testing.F) {
	l, err := local.New(local.Options{Subnet: netip.MustParsePrefix("10.200.9.0/24"), StateDir: f.TempDir()})
	if err != nil {
		f.Fatal(err)
	}
	providers := []*provider.Provider{dummy.New(dummy.Options{Dir: f.TempDir()}), l.Provider(), taggedProvider()}
	for _, s := range []string{
		`{"token":"abc"}`, `{"token":"abc","quota":3}`, `{"token":"abc","quota":65}`, `{"token":"ab"}`,
		`{"network_id":"n1"}`, `{"name":"ab","size":3,"ratio":1.0,"tier":"pro","secret":"s3cr3t-value"}`,
		`{"name":"a","secret":"s3cr3t-value"}`, `{"name":"abc","size":1e400}`, `{"name":"abc","size":-0}`,
		`{"name":"abc","ratio":"1"}`, `{"name":"abc","unknown":1}`, `{"name":"abc","name":"x"}`,
		`{"name":"\ud800"}`, `null`, `[]`, `""`, `{}`, `{"__proto__":{}}`, `{"name":"abc","size":2.5}`,
	} {
		for i := range providers {
			f.Add([]byte(s), uint8(i), false)
			f.Add([]byte(s), uint8(i), true)
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte, which uint8, bootstrap bool) {
		p := providers[int(which)%len(providers)]
		part := provider.PartCredential
		if bootstrap {
			part = provider.PartBootstrap
		}
		if p.JSONSchema(part) == nil {
			return
		}
		v, err := p.DecodePart(t.Context(), part, raw, nil)
		if err != nil {
			// A secret field's value never shows in the error (the test type's secret).
			var m map[string]any
			if json.Unmarshal(raw, &m) == nil {
				if s, _ := m["secret"].(string); len(s) >= 6 && strings.Contains(err.Error(), s) {
					t.Errorf("%s %s: the error shows the secret %q: %v", p.Name, part, s, err)
				}
			}
			return
		}
		back, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s %s: accepted %q, but its value does not marshal: %v", p.Name, part, raw, err)
		}
		v2, err := p.DecodePart(t.Context(), part, back, nil)
		if err != nil && p.Name == "tagged" && optionalZero(raw, err) {
			// Known (docs/RELIABILITY.md, "Defects found"): an optional field with a minimum but
			// without omitempty is stored as 0, which its own schema refuses. The in-tree
			// providers' optional fields carry omitempty; their round trips are checked.
			t.Skip("optional field without omitempty:", err)
		}
		if err != nil {
			t.Fatalf("%s %s: accepted %q, then refused its own value %s: %v", p.Name, part, raw, back, err)
		}
		if !reflect.DeepEqual(v, v2) {
			t.Errorf("%s %s: %q decoded to %#v, sent back as %s to %#v", p.Name, part, raw, v, back, v2)
		}
		if _, err := p.DecodePart(t.Context(), part, back, back); err != nil {
			t.Errorf("%s %s: %s refused as an update of itself: %v", p.Name, part, back, err)
		}
	})
}

// optionalZero: err names a field raw did not send (its zero value, marshalled back, was refused).
func optionalZero(raw []byte, err error) bool {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return false
	}
	field, _, ok := strings.Cut(strings.TrimPrefix(err.Error(), "field "), " ")
	_, sent := m[field]
	return ok && strings.HasPrefix(err.Error(), "field ") && !sent
}
