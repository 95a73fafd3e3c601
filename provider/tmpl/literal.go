package tmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// LiteralString returns the value of attribute attr of resource typ.name when it is a literal
// string: a quoted string or heredoc without interpolations or directives ("$${" and "%%{"
// escapes are fine and read as "${" and "%{", as Terraform would). ok is false when the attribute
// is absent or is anything else. attr is "name", or "name.key" for a key of an object-valued
// attribute (metadata.user-data). The error is for an unknown resource or a malformed attr.
func (c *Config) LiteralString(typ, name, attr string) (value string, ok bool, err error) {
	r, err := c.resource(typ, name)
	if err != nil {
		return "", false, err
	}
	p, err := parseAttrPath(attr)
	if err != nil {
		return "", false, err
	}
	a, item, _ := lookupAttr(r.block.Body, p)
	if a == nil || (p.key != "" && item == nil) {
		return "", false, nil
	}
	e := a.Expr
	if item != nil {
		e = item.Value
	}
	v, lit := literal(r.f, e)
	s, isString := v.(string)
	return s, lit && isString, nil
}

// LiteralAttrs returns the top-level attributes of resource typ.name whose values are literal
// strings, numbers or bools (meta-arguments such as a literal count included). Whole numbers are
// int64, others float64. It returns nil for an unknown resource.
func (c *Config) LiteralAttrs(typ, name string) map[string]any {
	r, err := c.resource(typ, name)
	if err != nil {
		return nil
	}
	out := map[string]any{}
	for n, a := range attributes(r.block.Body) {
		if v, ok := literal(r.f, a.Expr); ok {
			out[n] = v
		}
	}
	return out
}

// attrPath is "attr" or "attr.key".
type attrPath struct{ attr, key string }

func (p attrPath) String() string {
	if p.key == "" {
		return p.attr
	}
	return p.attr + "." + p.key
}

func parseAttrPath(s string) (attrPath, error) {
	attr, key, nested := strings.Cut(s, ".")
	if !hclsyntax.ValidIdentifier(attr) || (nested && key == "") {
		return attrPath{}, fmt.Errorf("attribute %q: want a name or name.key", s)
	}
	return attrPath{attr: attr, key: key}, nil
}

// lookupAttr finds the attribute and, for a path with a key, the item of its object value.
// isObject reports whether the attribute's expression is an object constructor.
func lookupAttr(body hcl.Body, p attrPath) (a *hcl.Attribute, item *hcl.KeyValuePair, isObject bool) {
	a = attributes(body)[p.attr]
	if a == nil || p.key == "" {
		return a, nil, false
	}
	pairs, diags := hcl.ExprMap(a.Expr)
	if diags.HasErrors() {
		return a, nil, false
	}
	for i := range pairs {
		k, diags := pairs[i].Key.Value(nil)
		if !diags.HasErrors() && k.Type() == cty.String && k.IsKnown() && !k.IsNull() && k.AsString() == p.key {
			return a, &pairs[i], true
		}
	}
	return a, nil, true
}

// literal returns the value of e when it is a literal string, number or bool.
func literal(f *file, e hcl.Expression) (any, bool) {
	if f.json {
		return jsonLiteral(f, e)
	}
	return nativeLiteral(e)
}

func nativeLiteral(e hcl.Expression) (any, bool) {
	switch e := e.(type) {
	case *hclsyntax.LiteralValueExpr:
		return ctyLiteral(e.Val)
	case *hclsyntax.TemplateExpr:
		var b strings.Builder
		for _, p := range e.Parts {
			lit, ok := p.(*hclsyntax.LiteralValueExpr)
			if !ok || lit.Val.Type() != cty.String || lit.Val.IsNull() {
				return nil, false
			}
			b.WriteString(lit.Val.AsString())
		}
		return b.String(), true
	case *hclsyntax.UnaryOpExpr:
		lit, ok := e.Val.(*hclsyntax.LiteralValueExpr)
		if !ok || e.Op != hclsyntax.OpNegate || lit.Val.Type() != cty.Number || lit.Val.IsNull() {
			return nil, false
		}
		return ctyLiteral(lit.Val.Negate())
	}
	return nil, false
}

func ctyLiteral(v cty.Value) (any, bool) {
	if v.IsNull() || !v.IsKnown() {
		return nil, false
	}
	switch v.Type() {
	case cty.String:
		return v.AsString(), true
	case cty.Bool:
		return v.True(), true
	case cty.Number:
		return number(v.AsBigFloat())
	}
	return nil, false
}

func number(bf *big.Float) (any, bool) {
	if bf.IsInt() {
		if i, acc := bf.Int64(); acc == big.Exact {
			return i, true
		}
	}
	f, _ := bf.Float64()
	return f, true
}

// jsonLiteral reads e's JSON token from the source. In Terraform's JSON syntax every string is a
// template, so a string is literal only when its template has no interpolation or directive.
func jsonLiteral(f *file, e hcl.Expression) (any, bool) {
	r := e.Range()
	raw := f.src[r.Start.Byte:r.End.Byte]
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	switch v := v.(type) {
	case string:
		t, diags := hclsyntax.ParseTemplate([]byte(v), f.name, r.Start)
		if diags.HasErrors() {
			return nil, false
		}
		return nativeLiteral(t)
	case json.Number:
		bf, _, err := big.ParseFloat(v.String(), 10, 512, big.ToNearestEven)
		if err != nil {
			return nil, false
		}
		return number(bf)
	case bool:
		return v, true
	}
	return nil, false
}

func jsonString(raw string) (string, bool) {
	var s string
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return "", false
	}
	return s, true
}
