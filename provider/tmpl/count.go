package tmpl

import (
	"math/big"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// Count evaluates the count meta-argument of resource typ.name before Terraform runs, as far as
// it can be known from the files alone: a literal, or an expression of input variables only
// (var.n, var.n * 2, "${var.n}" in JSON), each variable taking its value from vars (as the stack
// gives it: a string, or a number) or else its declared default. It returns 1 for a resource
// without count. known is false when the count depends on anything else (locals, functions,
// data sources, other resources, a variable without a value) or does not evaluate to a whole
// number: Terraform's plan then decides. The error is for an unknown resource.
func (c *Config) Count(typ, name string, vars map[string]any) (n int64, known bool, err error) {
	r, err := c.resource(typ, name)
	if err != nil {
		return 0, false, err
	}
	a := attributes(r.block.Body)["count"]
	if a == nil {
		return 1, true, nil
	}
	values := map[string]cty.Value{}
	for _, t := range a.Expr.Variables() {
		if t.RootName() != "var" || len(t) < 2 {
			return 0, false, nil
		}
		at, ok := t[1].(hcl.TraverseAttr)
		if !ok {
			return 0, false, nil
		}
		v, ok := c.variableValue(at.Name, vars)
		if !ok {
			return 0, false, nil
		}
		values[at.Name] = v
	}
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{"var": cty.ObjectVal(values)}}
	v, diags := a.Expr.Value(ctx)
	if diags.HasErrors() || !v.IsWhollyKnown() || v.IsNull() {
		return 0, false, nil
	}
	v, cerr := convert.Convert(v, cty.Number)
	if cerr != nil || v.IsNull() {
		return 0, false, nil
	}
	i, acc := v.AsBigFloat().Int64()
	if acc != big.Exact {
		return 0, false, nil
	}
	return i, true, nil
}

// variableValue is variable name's value: vars[name] when set (a string, or a number), else its
// declared default when that is a constant expression. ok is false for an undeclared variable or
// an unknown value.
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
			if d == nil || len(d.Expr.Variables()) > 0 {
				return cty.NilVal, false
			}
			v, diags := d.Expr.Value(nil)
			if diags.HasErrors() {
				return cty.NilVal, false
			}
			return v, true
		}
	}
	return cty.NilVal, false
}
