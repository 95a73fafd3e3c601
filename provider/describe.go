package provider

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// Describe builds p's description from its schemas and capabilities.
func Describe(p *Provider) Description {
	d := Description{Name: p.Name, Kind: p.Kind, Version: p.Version, ResourceType: p.ResourceType, Description: p.Description,
		CloudInit: !p.NoCloudInit, Available: true, Capabilities: p.Caps(),
		Schemas: Schemas{Credential: p.JSONSchema(PartCredential), Bootstrap: p.JSONSchema(PartBootstrap), Metadata: p.JSONSchema(PartMetadata)}}
	if d.Kind == "" {
		d.Kind = KindBuiltin
	}
	d.Credential = SchemaFields(d.Schemas.Credential)
	d.Bootstrap = SchemaFields(d.Schemas.Bootstrap)
	if p.Available != nil {
		if err := p.Available(); err != nil {
			d.Available, d.Unavailable = false, err.Error()
		}
	}
	if p.Constraints != nil {
		d.Constraints = p.Constraints()
	}
	return d
}

// Fields lists the fields of struct v (or *struct) by their json names and kloud tags.
func Fields(v any) []Field {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	out := []Field{}
	if t == nil || t.Kind() != reflect.Struct {
		return out
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := strings.Split(f.Tag.Get("json"), ",")[0]
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fd := Field{Name: name, Label: f.Name, Type: kind(f.Type), Default: f.Tag.Get("default"), Description: f.Tag.Get("doc"),
			Min: f.Tag.Get("min"), Max: f.Tag.Get("max")}
		if e := f.Tag.Get("enum"); e != "" {
			fd.Enum = strings.Split(e, "|")
		}
		if tag, ok := f.Tag.Lookup("kloud"); ok {
			parts := strings.Split(tag, ",")
			if parts[0] != "" {
				fd.Label = parts[0]
			}
			for _, p := range parts[1:] {
				switch strings.TrimSpace(p) {
				case "secret":
					fd.Secret = true
				case "required":
					fd.Required = true
				case "immutable":
					fd.Immutable = true
				}
			}
		}
		out = append(out, fd)
	}
	return out
}

func kind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	}
	return "string"
}

// Decode decodes raw JSON into a new value from newFn (strictly: unknown fields are errors),
// fills `default` tags of empty fields, checks `required` ones, and runs Valid() if present.
// With a nil newFn it returns the raw data as a map.
func Decode(newFn func() any, raw json.RawMessage) (any, error) {
	if newFn == nil {
		m := map[string]any{}
		if len(raw) > 0 && string(raw) != "null" {
			if err := json.Unmarshal(raw, &m); err != nil {
				return nil, err
			}
		}
		return m, nil
	}
	v := newFn()
	if len(raw) > 0 && string(raw) != "null" {
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return nil, err
		}
	}
	rv := reflect.ValueOf(v).Elem()
	if rv.Kind() == reflect.Struct {
		for i, f := range Fields(v) {
			fv := rv.Field(fieldIndex(rv.Type(), i))
			if fv.IsZero() && f.Default != "" {
				if err := json.Unmarshal([]byte(quoteIfString(fv.Kind(), f.Default)), fv.Addr().Interface()); err != nil {
					return nil, fmt.Errorf("default of %s: %w", f.Name, err)
				}
			}
			if fv.IsZero() && f.Required {
				return nil, fmt.Errorf("%s (%s) is required", f.Name, f.Label)
			}
		}
	}
	if val, ok := v.(interface{ Valid() error }); ok {
		if err := val.Valid(); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// fieldIndex maps the i-th described field back to its struct field index.
func fieldIndex(t reflect.Type, i int) int {
	n := -1
	for j := range t.NumField() {
		f := t.Field(j)
		if !f.IsExported() || strings.Split(f.Tag.Get("json"), ",")[0] == "-" {
			continue
		}
		n++
		if n == i {
			return j
		}
	}
	return -1
}

func quoteIfString(k reflect.Kind, s string) string {
	if k == reflect.String {
		b, _ := json.Marshal(s)
		return string(b)
	}
	return s
}

// SecretFields returns the json names of v's secret fields.
func SecretFields(v any) map[string]bool {
	out := map[string]bool{}
	for _, f := range Fields(v) {
		if f.Secret {
			out[f.Name] = true
		}
	}
	return out
}
