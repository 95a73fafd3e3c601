package provider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
	"github.com/kloud-dev/kloud/providers/local"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// compile compiles schema with the library's 2020-12 metaschema check (Compile validates a
// schema against its $schema's metaschema).
func compile(t *testing.T, schema json.RawMessage) error {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		return err
	}
	_, err = c.Compile("s.json")
	return err
}

// TestSchemaGolden: the capabilities and schemas the in-tree providers describe, against golden
// files (go test ./provider -run TestSchemaGolden -update rewrites them), each schema valid
// against the 2020-12 metaschema.
func TestSchemaGolden(t *testing.T) {
	l, err := local.New(local.Options{Subnet: netip.MustParsePrefix("10.200.9.0/24"), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*provider.Provider{dummy.New(dummy.Options{Dir: t.TempDir()}), l.Provider()} {
		t.Run(p.Name, func(t *testing.T) {
			d := provider.Describe(p)
			for _, part := range provider.Parts() {
				s := p.JSONSchema(part)
				if s == nil {
					continue
				}
				if err := compile(t, s); err != nil {
					t.Errorf("%s schema does not compile against the 2020-12 metaschema: %v", part, err)
				}
			}
			got, err := json.MarshalIndent(map[string]any{"kind": d.Kind, "capabilities": d.Capabilities, "schemas": d.Schemas}, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", "schema-"+p.Name+".json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("describe of %s:\n%s\nwant (%s):\n%s", p.Name, got, golden, want)
			}
		})
	}
}

// TestMetaschemaCheck: the compile check used above refuses an invalid schema (it can fail).
func TestMetaschemaCheck(t *testing.T) {
	bad := json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"objekt","properties":{"a":{"minimum":"x"}}}`)
	if err := compile(t, bad); err == nil {
		t.Fatal("an invalid schema compiled")
	}
	if err := provider.Validate(bad, json.RawMessage(`{}`)); err == nil || !strings.Contains(err.Error(), "schema") {
		t.Fatalf("Validate with an invalid schema: %v", err)
	}
}

type tagged struct {
	Name    string  `json:"name" kloud:"Name,required" min:"2" max:"8" doc:"what it is called"`
	Size    int     `json:"size" kloud:"Size" default:"2" min:"1" max:"16"`
	Ratio   float64 `json:"ratio" kloud:"Ratio" min:"0.5" max:"1.5"`
	Tier    string  `json:"tier" kloud:"Tier,immutable" enum:"free|pro" default:"free"`
	Debug   bool    `json:"debug" kloud:"Debug"`
	Secret  string  `json:"secret" kloud:"Secret,secret"`
	Skipped string  `json:"-"`
}

func (v *tagged) ValidUpdate(old any) error {
	if o := old.(*tagged); o.Size > v.Size {
		return errors.New("size: cannot shrink")
	}
	return nil
}

func taggedProvider() *provider.Provider {
	return &provider.Provider{Name: "tagged", Schema: provider.Schema{NewCredential: func() any { return &tagged{} }}}
}

func TestGenerate(t *testing.T) {
	s, err := provider.Generate(&tagged{})
	if err != nil {
		t.Fatal(err)
	}
	if err := compile(t, s); err != nil {
		t.Fatal(err)
	}
	want := `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{` +
		`"name":{"type":"string","title":"Name","description":"what it is called","minLength":2,"maxLength":8,"propertyOrder":0},` +
		`"size":{"type":"integer","title":"Size","default":2,"minimum":1,"maximum":16,"propertyOrder":1},` +
		`"ratio":{"type":"number","title":"Ratio","minimum":0.5,"maximum":1.5,"propertyOrder":2},` +
		`"tier":{"type":"string","title":"Tier","default":"free","enum":["free","pro"],"immutable":true,"propertyOrder":3},` +
		`"debug":{"type":"boolean","title":"Debug","propertyOrder":4},` +
		`"secret":{"type":"string","title":"Secret","writeOnly":true,"propertyOrder":5}},` +
		`"required":["name"],"additionalProperties":false}`
	if string(s) != want {
		t.Errorf("schema\n%s\nwant\n%s", s, want)
	}
	// The fields read back from the schema are the ones from the tags, in their order even
	// when the object's keys come in another (a JSON-RPC hop re-encodes params through a map).
	fromTags, fromSchema := provider.Fields(&tagged{}), provider.SchemaFields(s)
	if !reflect.DeepEqual(fromTags, fromSchema) {
		t.Errorf("fields from tags %+v\nfrom schema %+v", fromTags, fromSchema)
	}
	var m map[string]any
	json.Unmarshal(s, &m)
	resorted, _ := json.Marshal(m)
	if bytes.Equal(resorted, s) || !reflect.DeepEqual(provider.SchemaFields(resorted), fromTags) {
		t.Errorf("fields of the schema with sorted keys %+v", provider.SchemaFields(resorted))
	}
	for _, bad := range []any{
		&struct {
			A int `json:"a" min:"x"`
		}{},
		&struct {
			A bool `json:"a" enum:"yes|no"`
		}{},
		&struct {
			A bool `json:"a" max:"2"`
		}{},
		42,
	} {
		if _, err := provider.Generate(bad); err == nil {
			t.Errorf("Generate(%T) did not fail", bad)
		}
	}
}

func TestValidateErrors(t *testing.T) {
	s := taggedProvider().JSONSchema(provider.PartCredential)
	for raw, want := range map[string][]string{
		`{}`:                           {"field name (Name) is required"},
		`{"name":""}`:                  {"field name (Name) is required"},
		`{"name":"abcdefghij"}`:        {"field name (Name) must be at most 8 characters long (maxLength; got 10)"},
		`{"name":"ab","tier":"gold"}`:  {`field tier (Tier) must be one of free, pro (enum; got "gold")`},
		`{"name":"ab","size":0}`:       {"field size (Size) must be at least 1 (minimum; got 0)"},
		`{"name":"ab","size":17}`:      {"field size (Size) must be at most 16 (maximum; got 17)"},
		`{"name":"ab","ratio":2}`:      {"field ratio (Ratio) must be at most 1.5 (maximum; got 2)"},
		`{"name":"ab","size":"2"}`:     {"field size (Size) must be of type integer (type; got string)"},
		`{"name":"ab","size":1.5}`:     {"field size (Size) must be of type integer"},
		`{"name":"ab","debug":"yes"}`:  {"field debug (Debug) must be of type boolean"},
		`{"name":"ab","colour":"red"}`: {"unknown field(s) colour (fields: name, size, ratio, tier, debug, secret)"},
		`["name"]`:                     {"the value must be a JSON object of fields (name, size, ratio, tier, debug, secret), not array"},
		`{"size":0,"tier":"x"}`:        {"field name (Name) is required", "field size (Size) must be at least 1", "field tier (Tier) must be one of free, pro"},
	} {
		err := provider.Validate(s, json.RawMessage(raw))
		if err == nil {
			t.Errorf("%s: valid", raw)
			continue
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v\nwant it to say %q", raw, err, w)
			}
		}
	}
	if err := provider.Validate(s, json.RawMessage(`{"name":"ab","size":3,"ratio":1,"tier":"pro","debug":true,"secret":"x"}`)); err != nil {
		t.Errorf("a valid value: %v", err)
	}
	// A secret's value is never echoed.
	ds := dummy.New(dummy.Options{Dir: t.TempDir()}).JSONSchema(provider.PartCredential)
	err := provider.Validate(ds, json.RawMessage(`{"token":"s3"}`))
	if err == nil || strings.Contains(err.Error(), "s3") || strings.Contains(err.Error(), "got") || !strings.Contains(err.Error(), "field token (API token) must be at least 3 characters long") {
		t.Errorf("short secret: %v", err)
	}
}

func TestDecodePart(t *testing.T) {
	ctx := context.Background()
	p := taggedProvider()
	v, err := p.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"name":"ab","size":4}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.(*tagged); got.Size != 4 || got.Tier != "free" {
		t.Fatalf("decoded %+v (want the tier's default filled)", got)
	}
	old, _ := json.Marshal(v)
	// An update that keeps the immutable field and grows the size.
	if _, err := p.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"name":"abc","size":5,"tier":"free"}`), old); err != nil {
		t.Errorf("valid update: %v", err)
	}
	// The immutable field cannot change.
	_, err = p.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"name":"ab","size":4,"tier":"pro"}`), old)
	if err == nil || !strings.Contains(err.Error(), `field tier (Tier) is immutable: it cannot change from "free" to "pro"`) {
		t.Errorf("immutable change: %v", err)
	}
	// Nor be changed by omission (the default is not the old value... here it is, so it passes).
	if _, err := p.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"name":"ab","size":4}`), old); err != nil {
		t.Errorf("update leaving the immutable field at its (old) default: %v", err)
	}
	// ValidUpdate sees the old value in its own type.
	_, err = p.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"name":"ab","size":3}`), old)
	if err == nil || err.Error() != "size: cannot shrink" {
		t.Errorf("ValidUpdate: %v", err)
	}
	// Schema validation comes first, with its clear errors.
	_, err = p.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"name":"ab","tier":"gold"}`), nil)
	if err == nil || !strings.Contains(err.Error(), "must be one of free, pro") {
		t.Errorf("enum: %v", err)
	}
	// A part the provider does not have decodes to a map.
	if m, err := p.DecodePart(ctx, provider.PartMetadata, json.RawMessage(`{"a":1}`), nil); err != nil || m.(map[string]any)["a"] == nil {
		t.Errorf("metadata without a type: %v %v", m, err)
	}

	// The dummy: region is immutable with an enum, the quota cannot be removed.
	d := dummy.New(dummy.Options{Dir: t.TempDir()})
	v, err = d.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"token":"abc","region":"local-2","quota":3}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	old, _ = json.Marshal(v)
	for raw, want := range map[string]string{
		`{"token":"abcd","region":"local-1","quota":3}`: `field region (Region) is immutable: it cannot change from "local-2" to "local-1"`,
		`{"token":"abcd","quota":3}`:                    `field region (Region) is immutable: it cannot change from "local-2" to "local-1"`,
		`{"token":"abcd","region":"local-2"}`:           "quota: it was 3; a quota cannot be removed",
		`{"token":"abcd","region":"mars","quota":3}`:    "field region (Region) must be one of local-1, local-2",
		`{"token":"abcd","region":"local-2","quota":4}`: "",
	} {
		_, err := d.DecodePart(ctx, provider.PartCredential, json.RawMessage(raw), old)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("dummy update to %s: %v, want %q", raw, err, want)
		}
	}
}

// TestDecodePartDecoder: a provider whose Decoder decodes elsewhere (as a plugin's proxy does:
// here the decoding side is the real dummy provider) gets the same validation, immutable check
// and normalized value, as a map.
func TestDecodePartDecoder(t *testing.T) {
	ctx := context.Background()
	real := dummy.New(dummy.Options{Dir: t.TempDir()})
	var calls int
	proxy := &provider.Provider{Name: "dummy",
		Schema: provider.Schema{JSON: map[string]json.RawMessage{provider.PartCredential: real.JSONSchema(provider.PartCredential)}},
		Decoder: func(ctx context.Context, part string, raw, old json.RawMessage) (json.RawMessage, error) {
			calls++
			v, err := real.DecodePart(ctx, part, raw, old)
			if err != nil {
				return nil, err
			}
			return json.Marshal(v)
		},
	}
	if !proxy.HasPart(provider.PartCredential) || proxy.HasPart(provider.PartBootstrap) {
		t.Errorf("parts of the proxy")
	}
	v, err := proxy.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"token":"abc"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := v.(map[string]any); m["region"] != "local-1" || m["token"] != "abc" {
		t.Errorf("decoded %v", m)
	}
	// Schema errors are found before the decoder is asked.
	if _, err := proxy.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"token":"abc","x":1}`), nil); err == nil || !strings.Contains(err.Error(), "unknown field(s) x") || calls != 1 {
		t.Errorf("unknown field: %v (decoder calls %d, want 1)", err, calls)
	}
	old, _ := json.Marshal(v)
	if _, err := proxy.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"token":"abc","region":"local-2"}`), old); err == nil || !strings.Contains(err.Error(), "is immutable") {
		t.Errorf("immutable through the decoder: %v", err)
	}
	// A value only the API would refuse decodes.
	if _, err := proxy.DecodePart(ctx, provider.PartCredential, json.RawMessage(`{"token":"invalid","quota":1}`), nil); err != nil {
		t.Errorf("valid value: %v", err)
	}
}

func TestParseFields(t *testing.T) {
	s := taggedProvider().JSONSchema(provider.PartCredential)
	raw, err := provider.ParseFields(s, []string{"name=ab", "size=3", "ratio=0.75", "debug=true", "secret=a=b"})
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != `{"debug":true,"name":"ab","ratio":0.75,"secret":"a=b","size":3}` {
		t.Errorf("parsed %s", raw)
	}
	for _, c := range []struct{ in, want string }{
		{"size=big", `field size must be an integer, not "big"`},
		{"ratio=x", `field ratio must be a number, not "x"`},
		{"debug=maybe", `field debug must be true or false, not "maybe"`},
		{"colour=red", "unknown field colour (fields: name, size, ratio, tier, debug, secret)"},
		{"name", `field "name": want name=value`},
	} {
		if _, err := provider.ParseFields(s, []string{c.in}); err == nil || err.Error() != c.want {
			t.Errorf("%s: %v, want %q", c.in, err, c.want)
		}
	}
}

// A machine with only the required methods.
type plainMachine struct{}

func (plainMachine) Start(context.Context) (any, error) { return nil, nil }
func (plainMachine) Stop(context.Context) (any, error)  { return nil, nil }
func (plainMachine) Info(context.Context) (provider.State, any, error) {
	return provider.Running, nil, nil
}

type resizingMachine struct{ plainMachine }

func (resizingMachine) Resize(context.Context, int, float64) (any, error) { return nil, nil }

type checkingStack struct{ exampleStack }

func (checkingStack) ValidateConstraints(context.Context, map[string]any) error { return nil }

func TestCaps(t *testing.T) {
	caps := func(p *provider.Provider) string {
		var s []string
		for _, c := range p.Caps() {
			s = append(s, string(c))
		}
		return strings.Join(s, ",")
	}
	plain := &provider.Provider{Name: "plain",
		Machine: func(*provider.BaseMachine) (provider.Machine, error) { return plainMachine{}, nil },
		Stack:   func(b *provider.BaseStack) (provider.Stack, error) { return exampleStack{b}, nil }}
	if got := caps(plain); got != "info,start,stop" {
		t.Errorf("a provider without optional interfaces: %s", got)
	}
	if plain.Can(provider.CapConsoleLog) || !plain.Can(provider.CapStop) {
		t.Errorf("Can of plain")
	}
	rich := &provider.Provider{Name: "rich",
		Schema:  provider.Schema{NewBootstrap: func() any { return &tagged{} }},
		Machine: func(*provider.BaseMachine) (provider.Machine, error) { return resizingMachine{}, nil },
		Stack:   func(b *provider.BaseStack) (provider.Stack, error) { return checkingStack{exampleStack{b}}, nil }}
	if got := caps(rich); got != "bootstrap,constraints,info,resize,start,stop" {
		t.Errorf("a provider with resize, constraints and bootstrap: %s", got)
	}
	// Constructors that panic or fail on an empty Base*: no optional capability, no panic.
	panicky := &provider.Provider{Name: "panicky",
		Machine: func(b *provider.BaseMachine) (provider.Machine, error) {
			_ = b.Attributes["id"].(string)
			return resizingMachine{}, nil
		},
		Stack: func(*provider.BaseStack) (provider.Stack, error) { return nil, errors.New("no") }}
	if got := caps(panicky); got != "info,start,stop" {
		t.Errorf("panicking constructors: %s", got)
	}
	if got := caps(&provider.Provider{Name: "bare"}); got != "info,start,stop" {
		t.Errorf("no constructors: %s", got)
	}
	// Capabilities set: exactly those (sorted, deduplicated), even less than the interfaces.
	d := dummy.New(dummy.Options{Dir: t.TempDir()})
	if got := caps(d); got != "bootstrap,consoleLog,info,snapshot,start,stop" {
		t.Errorf("dummy: %s", got)
	}
	d.Capabilities = []provider.Capability{provider.CapStart, provider.CapInfo, provider.CapStart}
	if got := caps(d); got != "info,start" || d.Can(provider.CapStop) || d.Can(provider.CapConsoleLog) {
		t.Errorf("dummy with Capabilities set: %s", got)
	}
}
