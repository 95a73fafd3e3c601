package tmpl

import (
	"bytes"
	"encoding/json"
	"math/big"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// Count evaluates the count meta-argument of resource typ.name before Terraform runs, as far as
// it can be known from the files alone: a literal, or an expression of input variables and
// locals only (var.n, var.n * 2, local.n, a conditional, "${var.n}" in JSON), each variable
// taking its value from vars (as the stack gives it: a string, or a number) or else its declared
// default. It returns 1 for a resource without count. known is false when the count depends on
// anything else (functions, for expressions, splats, data sources, other resources, a variable
// without a value) or does not evaluate to a whole number: Terraform's plan then decides. The
// evaluation is cheap whatever the files say (no loops or functions; each local once). The
// error is for an unknown resource.
func (c *Config) Count(typ, name string, vars map[string]any) (n int64, known bool, err error) {
	r, err := c.resource(typ, name)
	if err != nil {
		return 0, false, err
	}
	a := attributes(r.block.Body)["count"]
	if a == nil {
		return 1, true, nil
	}
	ev := &staticEval{c: c, vars: vars, locals: map[string]*staticValue{}}
	v, ok := ev.eval(r.f, a.Expr, 0)
	if !ok {
		return 0, false, nil
	}
	v, cerr := convert.Convert(v, cty.Number)
	if cerr != nil || v.IsNull() || !v.IsKnown() {
		return 0, false, nil
	}
	i, acc := v.AsBigFloat().Int64()
	if acc != big.Exact {
		return 0, false, nil
	}
	return i, true, nil
}

// maxLocalDepth bounds how deep locals may refer to locals in a count kloud evaluates (a cycle
// or a deeper chain is left to Terraform).
const maxLocalDepth = 8

// staticEval evaluates expressions of variables and locals; locals are evaluated once.
type staticEval struct {
	c      *Config
	vars   map[string]any
	locals map[string]*staticValue
}

type staticValue struct {
	v  cty.Value
	ok bool
}

// eval evaluates e of file f (depth: how many locals deep this is).
func (ev *staticEval) eval(f *file, e hcl.Expression, depth int) (cty.Value, bool) {
	if depth > maxLocalDepth {
		return cty.NilVal, false
	}
	se, ok := syntaxExpr(f, e)
	if !ok || !cheap(se) {
		return cty.NilVal, false
	}
	varVals, localVals := map[string]cty.Value{}, map[string]cty.Value{}
	for _, t := range se.Variables() {
		if len(t) < 2 {
			return cty.NilVal, false
		}
		at, ok := t[1].(hcl.TraverseAttr)
		if !ok {
			return cty.NilVal, false
		}
		var v cty.Value
		switch t.RootName() {
		case "var":
			v, ok = ev.c.variableValue(at.Name, ev.vars)
			varVals[at.Name] = v
		case "local":
			v, ok = ev.local(at.Name, depth)
			localVals[at.Name] = v
		default:
			ok = false
		}
		if !ok {
			return cty.NilVal, false
		}
	}
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{"var": cty.ObjectVal(varVals), "local": cty.ObjectVal(localVals)}}
	v, diags := se.Value(ctx)
	if diags.HasErrors() || !v.IsWhollyKnown() || v.IsNull() {
		return cty.NilVal, false
	}
	return v, true
}

func (ev *staticEval) local(name string, depth int) (cty.Value, bool) {
	if sv, done := ev.locals[name]; done {
		return sv.v, sv.ok
	}
	ev.locals[name] = &staticValue{} // a cycle reads "unknown"
	sv := &staticValue{}
	if f, e := ev.c.localExpr(name); e != nil {
		sv.v, sv.ok = ev.eval(f, e, depth+1)
	}
	ev.locals[name] = sv
	return sv.v, sv.ok
}

// syntaxExpr is e in native syntax: itself, or for JSON a number or the template a string is.
func syntaxExpr(f *file, e hcl.Expression) (hclsyntax.Expression, bool) {
	if se, ok := e.(hclsyntax.Expression); ok {
		return se, true
	}
	if !f.json {
		return nil, false
	}
	r := e.Range()
	dec := json.NewDecoder(bytes.NewReader(f.src[r.Start.Byte:r.End.Byte]))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	var src string
	switch v := v.(type) {
	case json.Number:
		src = "${" + v.String() + "}"
	case string:
		src = v
	default:
		return nil, false
	}
	t, diags := hclsyntax.ParseTemplate([]byte(src), f.name, r.Start)
	if diags.HasErrors() {
		return nil, false
	}
	return t, true
}

// cheap reports whether e uses only literals, references, operators, conditionals and templates
// without directives: nothing that loops or calls a function.
func cheap(e hclsyntax.Expression) bool {
	ok := true
	hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		switch n.(type) {
		case *hclsyntax.LiteralValueExpr, *hclsyntax.ScopeTraversalExpr, *hclsyntax.BinaryOpExpr,
			*hclsyntax.UnaryOpExpr, *hclsyntax.ConditionalExpr, *hclsyntax.ParenthesesExpr,
			*hclsyntax.TemplateExpr, *hclsyntax.TemplateWrapExpr:
		default:
			ok = false
		}
		return nil
	})
	return ok
}

// localExpr is the expression of local value name and its file (nil when no locals block
// defines it).
func (c *Config) localExpr(name string) (*file, hcl.Expression) {
	for _, f := range c.files {
		blocks, _ := f.blocks()
		for _, b := range blocks {
			if b.Type != "locals" {
				continue
			}
			if a := attributes(b.Body)[name]; a != nil {
				return f, a.Expr
			}
		}
	}
	return nil, nil
}

// variableValue is variable name's value: vars[name] when set (a string, or a number), else its
// declared default when that is a literal. ok is false for an undeclared variable or an unknown
// value.
func (c *Config) variableValue(name string, vars map[string]any) (cty.Value, bool) {
	if _, declared := c.variable(name); !declared {
		return cty.NilVal, false
	}
	if x, set := vars[name]; set {
		switch x := x.(type) {
		case string:
			return cty.StringVal(x), true
		case int:
			return cty.NumberIntVal(int64(x)), true
		case int64:
			return cty.NumberIntVal(x), true
		case float64:
			return cty.NumberFloatVal(x), true
		}
		return cty.NilVal, false
	}
	for _, f := range c.files {
		blocks, _ := f.blocks()
		for _, b := range blocks {
			if b.Type != "variable" || len(b.Labels) == 0 || b.Labels[0] != name {
				continue
			}
			d := attributes(b.Body)["default"]
			if d == nil {
				return cty.NilVal, false
			}
			v, ok := literal(f, d.Expr)
			if !ok {
				return cty.NilVal, false
			}
			switch v := v.(type) {
			case string:
				return cty.StringVal(v), true
			case int64:
				return cty.NumberIntVal(v), true
			case float64:
				return cty.NumberFloatVal(v), true
			}
			return cty.NilVal, false
		}
	}
	return cty.NilVal, false
}
