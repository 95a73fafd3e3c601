package plugin_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// planCredential has the extended tags (enum, bounds, immutable, doc) and a ValidUpdate, which
// only the plugin's process can run.
type planCredential struct {
	Token string `json:"token" kloud:"Token,secret,required" min:"4"`
	Plan  string `json:"plan" kloud:"Plan,immutable" enum:"free|pro" default:"free" doc:"billing plan"`
	Seats int    `json:"seats" kloud:"Seats" min:"1" max:"10" default:"1"`
}

func (c *planCredential) ValidUpdate(old any) error {
	if o := old.(*planCredential); c.Seats < o.Seats {
		return errors.New("seats cannot go down")
	}
	return nil
}

// TestSchemasThroughThePlugin: a plugin's proxy describes the plugin's own JSON Schemas, kind
// plugin and its version, and decodes through the plugin: kloud's side validates against the
// schema and checks immutable fields, the plugin's side runs its type's Valid and ValidUpdate.
func TestSchemasThroughThePlugin(t *testing.T) {
	e := startKloud(t)
	in := filesProvider("plans", newSeen("a"), noUnavailable())
	in.Schema.NewCredential = func() any { return new(planCredential) }
	in.Capabilities = []provider.Capability{provider.CapStart, provider.CapInfo}
	e.run(in, e.pluginKey("plans"))
	e.wait("plans")
	ctx := t.Context()
	p, err := e.reg.Lookup("plans")
	if err != nil {
		t.Fatal(err)
	}
	m, err := plugin.ManifestOf(in)
	if err != nil {
		t.Fatal(err)
	}
	d := provider.Describe(p)
	if d.Kind != provider.KindPlugin || d.Version != "1.2.3" || len(d.Capabilities) != 2 || !p.Can(provider.CapInfo) || p.Can(provider.CapStop) {
		t.Errorf("describe: %+v", d)
	}
	// The same schemas (their keys reordered on the way: the fields keep their order by the
	// propertyOrder annotation).
	for _, part := range provider.Parts() {
		if want := in.JSONSchema(part); !sameJSON(p.JSONSchema(part), want) || !bytes.Equal(m.Schemas[part], want) ||
			!reflect.DeepEqual(provider.SchemaFields(p.JSONSchema(part)), provider.SchemaFields(want)) {
			t.Errorf("%s schema through the plugin:\n%s\nwant\n%s", part, p.JSONSchema(part), want)
		}
	}
	if names := fieldNames(d.Credential); names != "token,plan,seats" || !d.Credential[1].Immutable || strings.Join(d.Credential[1].Enum, "|") != "free|pro" {
		t.Errorf("described credential: %s %+v", d.Schemas.Credential, d.Credential)
	}

	v, err := p.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"token":"abcd","seats":3}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if mv := v.(map[string]any); mv["plan"] != "free" || mv["seats"] != json.Number("3") {
		t.Errorf("decoded through the plugin: %v", mv)
	}
	old, _ := json.Marshal(v)
	for raw, want := range map[string]string{
		`{"token":"abcd","seats":11}`:             "field seats (Seats) must be at most 10",
		`{"token":"abcd","plan":"gold"}`:          "field plan (Plan) must be one of free, pro",
		`{"token":"abcd","seats":3,"plan":"pro"}`: `field plan (Plan) is immutable: it cannot change from "free" to "pro"`,
		`{"token":"abcd","seats":2}`:              "seats cannot go down", // the plugin's ValidUpdate
		`{"token":"abcd","seats":4}`:              "",
	} {
		_, err := p.DecodePart(ctx, provider.PartCredential, json.RawMessage(raw), old)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("update to %s: %v, want %q", raw, err, want)
		}
	}
}

func sameJSON(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

func fieldNames(fs []provider.Field) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Name)
	}
	return strings.Join(out, ",")
}

// TestManifestSchemaChecked: kloud refuses a manifest whose schema is not a 2020-12 object
// schema.
func TestManifestSchemaChecked(t *testing.T) {
	m, err := plugin.ManifestOf(filesProvider("plans", newSeen("a"), noUnavailable()))
	if err != nil {
		t.Fatal(err)
	}
	if err := plugin.ValidateManifest(m); err != nil {
		t.Fatalf("a good manifest: %v", err)
	}
	for _, bad := range []string{
		`{"type":"object"}`,
		`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"a":{"type":"strin"}}}`,
		`[1]`,
	} {
		m.Schemas[provider.PartCredential] = json.RawMessage(bad)
		if err := plugin.ValidateManifest(m); err == nil || !strings.Contains(err.Error(), "provider.schemas.credential") {
			t.Errorf("schema %s: %v", bad, err)
		}
	}
}
