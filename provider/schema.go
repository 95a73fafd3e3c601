package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	jskind "github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// JSON Schemas of a provider's parts.
//
// Every part of a provider's Schema (credential, bootstrap outputs, machine metadata) has a JSON
// Schema (draft 2020-12) generated from its type's struct tags (Generate): what provider.describe
// returns, what the UI's credential form and the CLI's `--field` checks are built from, and what
// DecodePart validates a value against before decoding it. A plugin's proxy carries the schemas
// its plugin generated (Schema.JSON) and decodes in the plugin (Provider.Decoder), so kloud
// treats in-tree providers and plugins alike.
//
// Tags → keywords: json name → property name; kloud label → title; doc → description;
// default → default; enum:"a|b" → enum; min/max → minimum/maximum (numbers) or
// minLength/maxLength (strings); secret → writeOnly; immutable → the annotation "immutable"
// (DecodePart refuses to change the field on update); required (without a default) → required;
// the field's place in the struct → the annotation "propertyOrder" (0, 1, …: the order forms
// show, which object keys do not keep through every JSON hop).
// A required string without a min gets minLength 1. Unknown properties are refused
// (additionalProperties false), as Decode refuses unknown fields.

// Schema parts.
const (
	PartCredential = "credential"
	PartBootstrap  = "bootstrap"
	PartMetadata   = "metadata"
)

// Parts lists the schema parts.
func Parts() []string { return []string{PartCredential, PartBootstrap, PartMetadata} }

// SchemaDialect is the $schema of every generated schema.
const SchemaDialect = ptype.SchemaDialect

// newFunc returns the constructor of part's type.
func (p *Provider) newFunc(part string) func() any {
	switch part {
	case PartCredential:
		return p.Schema.NewCredential
	case PartBootstrap:
		return p.Schema.NewBootstrap
	case PartMetadata:
		return p.Schema.NewMetadata
	}
	return nil
}

// JSONSchema returns the JSON Schema of part: Schema.JSON's if set, else generated from the
// part's New* type. Nil if the provider has no such part.
func (p *Provider) JSONSchema(part string) json.RawMessage {
	if p.Schema.JSON != nil {
		return p.Schema.JSON[part]
	}
	fn := p.newFunc(part)
	if fn == nil {
		return nil
	}
	s, err := Generate(fn())
	if err != nil {
		// A type whose tags do not parse: a programming error of the provider, shown in
		// the schema rather than taking kloud down.
		b, _ := json.Marshal(map[string]any{"$schema": SchemaDialect, "description": "invalid schema: " + err.Error()})
		return b
	}
	return s
}

// HasPart reports whether p has part (a schema for it).
func (p *Provider) HasPart(part string) bool { return p.JSONSchema(part) != nil }

// property is one property of a generated schema, in keyword order.
type property struct {
	Type        string      `json:"type"`
	Title       string      `json:"title,omitempty"`
	Description string      `json:"description,omitempty"`
	Default     any         `json:"default,omitempty"`
	Enum        []any       `json:"enum,omitempty"`
	Minimum     json.Number `json:"minimum,omitempty"`
	Maximum     json.Number `json:"maximum,omitempty"`
	MinLength   *int        `json:"minLength,omitempty"`
	MaxLength   *int        `json:"maxLength,omitempty"`
	WriteOnly   bool        `json:"writeOnly,omitempty"`
	Immutable   bool        `json:"immutable,omitempty"`
	// Order is the field's place in its struct (the annotation "propertyOrder"): object keys
	// do not keep their order through every JSON hop (a JSON-RPC request's params are decoded
	// into a map and encoded again), and forms show fields in this order.
	Order int `json:"propertyOrder"`
}

// namedProperty keeps the field order of the struct (JSON objects are ordered on the wire; the
// UI shows fields in this order).
type namedProperty struct {
	name string
	p    property
}

type properties []namedProperty

func (ps properties) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, np := range ps {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(np.name)
		v, err := json.Marshal(np.p)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

type objectSchema struct {
	Schema               string     `json:"$schema"`
	Type                 string     `json:"type"`
	Properties           properties `json:"properties"`
	Required             []string   `json:"required,omitempty"`
	AdditionalProperties bool       `json:"additionalProperties"`
}

// Generate returns the JSON Schema of struct v (or *struct) from its fields' tags.
func Generate(v any) (json.RawMessage, error) {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("schema of %T: not a struct", v)
	}
	s := objectSchema{Schema: SchemaDialect, Type: "object", Properties: properties{}}
	for _, f := range Fields(v) {
		p := property{Type: f.Type, Title: f.Label, Description: f.Description, WriteOnly: f.Secret, Immutable: f.Immutable, Order: len(s.Properties)}
		if f.Label == "" {
			p.Title = f.Name
		}
		if f.Default != "" {
			d, err := typedValue(f.Type, f.Default)
			if err != nil {
				return nil, fmt.Errorf("field %s: default: %w", f.Name, err)
			}
			p.Default = d
		}
		for _, e := range f.Enum {
			ev, err := typedValue(f.Type, e)
			if err != nil {
				return nil, fmt.Errorf("field %s: enum: %w", f.Name, err)
			}
			p.Enum = append(p.Enum, ev)
		}
		for _, b := range []struct {
			tag    string
			num    *json.Number
			length **int
			what   string
		}{{f.Min, &p.Minimum, &p.MinLength, "min"}, {f.Max, &p.Maximum, &p.MaxLength, "max"}} {
			if b.tag == "" {
				continue
			}
			switch f.Type {
			case "integer", "number":
				if _, err := strconv.ParseFloat(b.tag, 64); err != nil {
					return nil, fmt.Errorf("field %s: %s %q is not a number", f.Name, b.what, b.tag)
				}
				*b.num = json.Number(b.tag)
			case "string":
				n, err := strconv.Atoi(b.tag)
				if err != nil || n < 0 {
					return nil, fmt.Errorf("field %s: %s %q is not a length", f.Name, b.what, b.tag)
				}
				*b.length = &n
			default:
				return nil, fmt.Errorf("field %s: %s applies to numbers and strings, not %s", f.Name, b.what, f.Type)
			}
		}
		if f.Required && f.Default == "" {
			s.Required = append(s.Required, f.Name)
			if f.Type == "string" && p.MinLength == nil && len(p.Enum) == 0 {
				p.MinLength = new(1)
			}
		}
		s.Properties = append(s.Properties, namedProperty{f.Name, p})
	}
	return json.Marshal(s)
}

// typedValue converts a tag's text to a JSON value of type typ.
func typedValue(typ, s string) (any, error) {
	switch typ {
	case "integer":
		if _, err := strconv.ParseInt(s, 10, 64); err != nil {
			return nil, fmt.Errorf("%q is not an integer", s)
		}
		return json.Number(s), nil
	case "number":
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			return nil, fmt.Errorf("%q is not a number", s)
		}
		return json.Number(s), nil
	case "boolean":
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a boolean", s)
		}
		return b, nil
	}
	return s, nil
}

// parsedSchema is what kloud reads of a part's schema (generated or a plugin's).
type parsedSchema struct {
	Properties json.RawMessage `json:"properties"`
	Required   []string        `json:"required"`
}

type parsedProperty struct {
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	Default     json.RawMessage `json:"default"`
	Enum        []any           `json:"enum"`
	Minimum     json.Number     `json:"minimum"`
	Maximum     json.Number     `json:"maximum"`
	MinLength   *int            `json:"minLength"`
	MaxLength   *int            `json:"maxLength"`
	WriteOnly   bool            `json:"writeOnly"`
	Immutable   bool            `json:"immutable"`
	Order       *int            `json:"propertyOrder"`
}

// SchemaFields lists the fields of an object schema, ordered by their "propertyOrder"
// annotations (then as the properties come). Nil or unparsable schemas have none.
func SchemaFields(schema json.RawMessage) []Field {
	out := []Field{}
	if len(schema) == 0 || string(schema) == "null" {
		return out
	}
	var ps parsedSchema
	if json.Unmarshal(schema, &ps) != nil || len(ps.Properties) == 0 {
		return out
	}
	dec := json.NewDecoder(bytes.NewReader(ps.Properties))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return out
	}
	order := map[string]int{}
	defer func() {
		slices.SortStableFunc(out, func(a, b Field) int {
			oa, aok := order[a.Name]
			ob, bok := order[b.Name]
			switch {
			case aok && bok:
				return oa - ob
			case aok:
				return -1
			case bok:
				return 1
			}
			return 0
		})
	}()
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return out
		}
		name, _ := tok.(string)
		var pp parsedProperty
		if err := dec.Decode(&pp); err != nil {
			return out
		}
		if pp.Order != nil {
			order[name] = *pp.Order
		}
		f := Field{Name: name, Type: pp.Type, Label: pp.Title, Secret: pp.WriteOnly, Immutable: pp.Immutable,
			Required: slices.Contains(ps.Required, name), Description: pp.Description,
			Min: string(pp.Minimum), Max: string(pp.Maximum)}
		if f.Type == "" {
			f.Type = "string"
		}
		if f.Label == "" {
			f.Label = name
		}
		if pp.MinLength != nil && !(f.Required && *pp.MinLength == 1) {
			f.Min = strconv.Itoa(*pp.MinLength)
		}
		if pp.MaxLength != nil {
			f.Max = strconv.Itoa(*pp.MaxLength)
		}
		if len(pp.Default) > 0 {
			f.Default = jsonText(pp.Default)
		}
		for _, e := range pp.Enum {
			b, _ := json.Marshal(e)
			f.Enum = append(f.Enum, jsonText(b))
		}
		out = append(out, f)
	}
	return out
}

// jsonText is a JSON value as a user types it: strings unquoted.
func jsonText(raw []byte) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// compile compiles schema, checking it against its metaschema (2020-12 for ours).
func compile(schema json.RawMessage) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	const url = "kloud-part.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	return sch, nil
}

// CheckSchema checks that schema (a plugin's, say) is a valid JSON Schema whose $schema is
// draft 2020-12, describing an object.
func CheckSchema(schema json.RawMessage) error {
	if err := ptype.CheckSchemaHeader(schema); err != nil {
		return err
	}
	_, err := compile(schema)
	return err
}

// Validate checks the JSON value raw (empty: {}) against schema and returns an error that names
// each offending field, the rule it breaks and what is allowed (enum values, bounds).
func Validate(schema, raw json.RawMessage) error {
	if len(schema) == 0 || string(schema) == "null" {
		return nil
	}
	sch, err := compile(schema)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = json.RawMessage("{}")
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	verr := sch.Validate(inst)
	if verr == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(verr, &ve) {
		return verr
	}
	fields := map[string]Field{}
	var names []string
	for _, f := range SchemaFields(schema) {
		fields[f.Name] = f
		names = append(names, f.Name)
	}
	var msgs []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			if m := problem(e, fields, names); m != "" && !slices.Contains(msgs, m) {
				msgs = append(msgs, m)
			}
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	if len(msgs) == 0 {
		return fmt.Errorf("invalid value: %v", verr)
	}
	return &InvalidError{Problems: msgs}
}

// InvalidError is a value that does not fit its schema: one problem per offending field.
type InvalidError struct{ Problems []string }

func (e *InvalidError) Error() string { return strings.Join(e.Problems, "; ") }

// problem turns one validation failure into a sentence.
func problem(e *jsonschema.ValidationError, fields map[string]Field, names []string) string {
	name := strings.Join(e.InstanceLocation, "/")
	label := func(n string) string {
		if f, ok := fields[n]; ok && f.Label != "" && f.Label != n {
			return fmt.Sprintf("field %s (%s)", n, f.Label)
		}
		return "field " + n
	}
	got := func(v any) string {
		if f, ok := fields[name]; ok && f.Secret {
			return "" // never echo a secret
		}
		b, _ := json.Marshal(v)
		return "; got " + string(b)
	}
	gotLen := func(n int) string {
		if f, ok := fields[name]; ok && f.Secret {
			return ""
		}
		return fmt.Sprintf("; got %d", n)
	}
	switch k := e.ErrorKind.(type) {
	case *jskind.Required:
		var out []string
		for _, m := range k.Missing {
			out = append(out, label(m)+" is required")
		}
		return strings.Join(out, "; ")
	case *jskind.AdditionalProperties:
		return fmt.Sprintf("unknown field(s) %s (fields: %s)", strings.Join(k.Properties, ", "), strings.Join(names, ", "))
	case *jskind.Type:
		if name == "" {
			return fmt.Sprintf("the value must be a JSON object of fields (%s), not %s", strings.Join(names, ", "), k.Got)
		}
		return fmt.Sprintf("%s must be of type %s (type; got %s)", label(name), strings.Join(k.Want, " or "), k.Got)
	case *jskind.Enum:
		var allowed []string
		for _, w := range k.Want {
			b, _ := json.Marshal(w)
			allowed = append(allowed, jsonText(b))
		}
		return fmt.Sprintf("%s must be one of %s (enum%s)", label(name), strings.Join(allowed, ", "), got(k.Got))
	case *jskind.Minimum:
		return fmt.Sprintf("%s must be at least %s (minimum%s)", label(name), rat(k.Want), got(json.Number(rat(k.Got))))
	case *jskind.Maximum:
		return fmt.Sprintf("%s must be at most %s (maximum%s)", label(name), rat(k.Want), got(json.Number(rat(k.Got))))
	case *jskind.MinLength:
		if k.Got == 0 {
			return label(name) + " is required (it is empty)"
		}
		return fmt.Sprintf("%s must be at least %d characters long (minLength%s)", label(name), k.Want, gotLen(k.Got))
	case *jskind.MaxLength:
		return fmt.Sprintf("%s must be at most %d characters long (maxLength%s)", label(name), k.Want, gotLen(k.Got))
	}
	if name == "" {
		return fmt.Sprintf("invalid value: %v", e.ErrorKind)
	}
	return fmt.Sprintf("%s: %v", label(name), e.ErrorKind)
}

func rat(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// DecodePart validates raw against part's schema, then decodes it: with Provider.Decoder if set
// (a plugin decodes in its process), else with the part's New* type (Decode: strict, defaults,
// required, Valid()). With old (the stored normalized value) non-nil it is an update: a field
// marked immutable must keep its old value, and a value whose type has `ValidUpdate(old any)
// error` is asked (old decoded into the same type). It returns the decoded value: *T in process,
// map[string]any (numbers as json.Number) from a Decoder or for a part without a type. Errors
// never contain secret values that were sent.
func (p *Provider) DecodePart(ctx context.Context, part string, raw, old json.RawMessage) (any, error) {
	schema := p.JSONSchema(part)
	if schema == nil && p.Decoder == nil {
		return Decode(nil, raw)
	}
	if err := Validate(schema, raw); err != nil {
		return nil, err
	}
	var v any
	if p.Decoder != nil {
		out, err := p.Decoder(ctx, part, raw, old)
		if err != nil {
			return nil, err
		}
		m := map[string]any{}
		dec := json.NewDecoder(bytes.NewReader(out))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			return nil, fmt.Errorf("decoded %s: %w", part, err)
		}
		v = m
	} else {
		fn := p.newFunc(part)
		var err error
		if v, err = Decode(fn, raw); err != nil {
			return nil, err
		}
		if old == nil {
			return v, nil
		}
		if err := checkImmutable(schema, v, old); err != nil {
			return nil, err
		}
		if vu, ok := v.(interface{ ValidUpdate(old any) error }); ok && fn != nil {
			ov := fn()
			if err := json.Unmarshal(old, ov); err != nil {
				return nil, fmt.Errorf("old %s value: %w", part, err)
			}
			if err := vu.ValidUpdate(ov); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	if old != nil {
		if err := checkImmutable(schema, v, old); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// checkImmutable fails if a field the schema marks immutable differs between v and old. A
// field old does not have (a value stored before the field existed) may be set.
func checkImmutable(schema json.RawMessage, v any, old json.RawMessage) error {
	oldM := map[string]any{}
	dec := json.NewDecoder(bytes.NewReader(old))
	dec.UseNumber()
	if err := dec.Decode(&oldM); err != nil {
		return fmt.Errorf("old value: %w", err)
	}
	newM := JSONMap(v)
	for _, f := range SchemaFields(schema) {
		if !f.Immutable {
			continue
		}
		ov, ok := oldM[f.Name]
		if !ok {
			continue
		}
		a, _ := json.Marshal(ov)
		b, _ := json.Marshal(newM[f.Name])
		if bytes.Equal(a, b) {
			continue
		}
		if f.Secret {
			return fmt.Errorf("field %s (%s) is immutable: it cannot be changed (add a new credential instead)", f.Name, f.Label)
		}
		return fmt.Errorf("field %s (%s) is immutable: it cannot change from %s to %s (add a new credential instead)", f.Name, f.Label, a, b)
	}
	return nil
}

// JSONMap returns v's JSON object form (numbers as json.Number); {} when v has none.
func JSONMap(v any) map[string]any {
	if m, ok := v.(map[string]any); ok {
		return m
	}
	b, err := json.Marshal(v)
	if err != nil {
		return map[string]any{}
	}
	m := map[string]any{}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if dec.Decode(&m) != nil {
		return map[string]any{}
	}
	return m
}

// ParseFields turns name=value pairs typed by a user (CLI flags) into a JSON object for schema:
// each value is converted to its field's type (integer, number, boolean; strings as typed).
// An unknown name is an error listing the schema's fields. The result is not validated: call
// Validate.
func ParseFields(schema json.RawMessage, pairs []string) (json.RawMessage, error) {
	fields := SchemaFields(schema)
	byName := map[string]Field{}
	var names []string
	for _, f := range fields {
		byName[f.Name] = f
		names = append(names, f.Name)
	}
	out := map[string]any{}
	for _, kv := range pairs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("field %q: want name=value", kv)
		}
		f, ok := byName[k]
		if !ok {
			return nil, fmt.Errorf("unknown field %s (fields: %s)", k, strings.Join(names, ", "))
		}
		switch f.Type {
		case "integer":
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return nil, fmt.Errorf("field %s must be an integer, not %q", k, v)
			}
			out[k] = json.Number(v)
		case "number":
			if _, err := strconv.ParseFloat(v, 64); err != nil {
				return nil, fmt.Errorf("field %s must be a number, not %q", k, v)
			}
			out[k] = json.Number(v)
		case "boolean":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, fmt.Errorf("field %s must be true or false, not %q", k, v)
			}
			out[k] = b
		default:
			out[k] = v
		}
	}
	return json.Marshal(out)
}
