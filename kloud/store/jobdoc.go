package store

import (
	"bytes"
	"encoding/json"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Doc is a job's params or result as the jobs collection keeps them: a BSON document, the
// encoding of a typed value ([EncodeDoc]) under its fields' JSON names, so the API shows a job
// (job.get, job.watch: [Doc.Map]) as it is stored. Its zero value is no document.
//
// Decoding ([Doc.Decode]) is lenient in the driver's way: keys the type does not have are
// ignored, an integral double fills an int. So a job written before params were typed (a map of
// the same camelCase keys) decodes into the kind's params after an upgrade.
type Doc struct{ raw bson.Raw }

// EncodeDoc is v (a struct, or a map with string keys) as a document. Keys are the fields' bson
// tags, else their json tags (the names the API shows), else their lower-cased names. A value
// that encodes to an empty document is the zero Doc.
func EncodeDoc(v any) (Doc, error) {
	var buf bytes.Buffer
	enc := bson.NewEncoder(bson.NewDocumentWriter(&buf))
	enc.UseJSONStructTags()
	if err := enc.Encode(v); err != nil {
		return Doc{}, fmt.Errorf("encode %T as a document: %w", v, err)
	}
	d := Doc{raw: bson.Raw(buf.Bytes())}
	if d.empty() {
		return Doc{}, nil
	}
	return d, nil
}

// empty reports whether d holds no keys (no document, or {}).
func (d Doc) empty() bool {
	return len(d.raw) <= 5 // an empty document is 5 bytes: its length and the terminating 0
}

// IsZero reports whether d is no document (a job without params or result). The driver leaves
// such a field out of the stored job.
func (d Doc) IsZero() bool { return d.empty() }

// Decode fills v (a pointer) from d, with EncodeDoc's names. A zero Doc leaves v as it is. A
// document in a field of type any decodes as a map[string]any (an array as the driver's A, a
// []any: the kinds' params hold none).
func (d Doc) Decode(v any) error {
	if d.empty() {
		return nil
	}
	dec := bson.NewDecoder(bson.NewDocumentReader(bytes.NewReader(d.raw)))
	dec.UseJSONStructTags()
	dec.DefaultDocumentMap()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode document into %T: %w", v, err)
	}
	return nil
}

// Map is d as plain Go values (map[string]any, []any, strings, numbers, bools), the form the
// API sends as JSON; nil for a zero Doc. A document the store read always decodes (the driver
// checked it); one that does not is nil too.
func (d Doc) Map() map[string]any {
	if d.empty() {
		return nil
	}
	var m map[string]any
	if err := bson.Unmarshal(d.raw, &m); err != nil {
		return nil
	}
	return plainMap(m)
}

// MarshalBSONValue stores d as an embedded document (bson.ValueMarshaler).
func (d Doc) MarshalBSONValue() (byte, []byte, error) {
	if d.empty() {
		return byte(bson.TypeNull), nil, nil
	}
	return byte(bson.TypeEmbeddedDocument), d.raw, nil
}

// UnmarshalBSONValue reads an embedded document (null or an empty document: the zero Doc).
func (d *Doc) UnmarshalBSONValue(typ byte, data []byte) error {
	switch bson.Type(typ) {
	case bson.TypeNull, bson.TypeUndefined:
		*d = Doc{}
		return nil
	case bson.TypeEmbeddedDocument:
		*d = Doc{raw: bson.Raw(bytes.Clone(data))}
		return nil
	}
	return fmt.Errorf("a job's params or result is a BSON %s, not a document", bson.Type(typ))
}

// MarshalJSON is d as a JSON object (Map), null for a zero Doc.
func (d Doc) MarshalJSON() ([]byte, error) { return json.Marshal(d.Map()) }

// JSONText is a field a document keeps as JSON text (a BSON string holding v's JSON): the
// stack.update job's files and variables, which its params have always shown so.
type JSONText[T any] struct{ V T }

// JSONTextOf is v as JSONText.
func JSONTextOf[T any](v T) JSONText[T] { return JSONText[T]{V: v} }

// MarshalBSONValue stores t as a string of JSON.
func (t JSONText[T]) MarshalBSONValue() (byte, []byte, error) {
	b, err := json.Marshal(t.V)
	if err != nil {
		return 0, nil, fmt.Errorf("JSON text: %w", err)
	}
	typ, data, err := bson.MarshalValue(string(b))
	return byte(typ), data, err
}

// UnmarshalBSONValue reads a string of JSON (null or "": the zero value).
func (t *JSONText[T]) UnmarshalBSONValue(typ byte, data []byte) error {
	var zero T
	t.V = zero
	rv := bson.RawValue{Type: bson.Type(typ), Value: data}
	switch rv.Type {
	case bson.TypeNull, bson.TypeUndefined:
		return nil
	case bson.TypeString:
		s := rv.StringValue()
		if s == "" {
			return nil
		}
		if err := json.Unmarshal([]byte(s), &t.V); err != nil {
			return fmt.Errorf("JSON text: %w", err)
		}
		return nil
	}
	return fmt.Errorf("JSON text is a BSON %s, not a string", rv.Type)
}
