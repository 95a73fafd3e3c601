package tmpl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// Parameters and presets (docs/user-guide.md "Parameters and presets"): a template's variable
// blocks are its typed parameters; kloud's metadata that Terraform has no place for is in
//
//	kloud_parameter "size" {     # names a variable of the template
//	  display_name = "Machine size"
//	  choices      = ["small", "large"]
//	  mutable      = false        # cannot change once the stack is built (default true)
//	  order        = 1
//	}
//	kloud_preset "big" {
//	  default = true              # at most one preset is the default
//	  values  = { size = "large" }
//	}
//
// Params reads them, Params.Resolve checks values against them (types, choices, the variables'
// validation blocks) before any build, and RemoveParams takes the kloud blocks out of the files
// Terraform sees.

// Block types of kloud's parameter metadata and presets.
const (
	ParameterBlock = "kloud_parameter"
	PresetBlock    = "kloud_preset"
)

// Parameter is a variable of the template offered to the stack's creator: its wire form
// (ptype.Parameter, what template.parameters returns) and what checking a value needs.
type Parameter struct {
	ptype.Parameter

	ordered  bool // order is set
	ty       cty.Type
	defaults *typeexpr.Defaults
	def      cty.Value // cty.NilVal without a default
	choices  []cty.Value
	rules    []rule
}

// Validation is a variable's validation block, as written.
type Validation = ptype.ParameterValidation

type rule struct {
	cond, msg hcl.Expression
	msgText   string
	// costly: the condition or the message loops (a for expression, a template's for
	// directive) or calls distinct: work quadratic in the values a stack's creator sends (two
	// nested loops over a list of 3,000 items took 27 s of kloud's CPU). kloud evaluates it
	// only over small values (smallValues), and never loops in loops (nested): Terraform's
	// plan checks those, in its sandbox.
	costly, nested bool
}

// costlyWord finds a loop or a call of distinct in an expression's source (also the words in a
// string literal: such a rule may be left to Terraform, which checks it anyway).
var costlyWord = regexp.MustCompile(`\bfor\b|\bdistinct\b`)

// costlyRule says whether the rule of condition cond and message msg (their sources) is costly,
// and whether it nests loops.
func costlyRule(cond, msg string) (costly, nested bool) {
	loops := 0
	for _, w := range append(costlyWord.FindAllString(cond, -1), costlyWord.FindAllString(msg, -1)...) {
		costly = true
		if w == "for" {
			loops++
		}
	}
	return costly, loops > 1
}

// smallElements and smallBytes bound the values (all of them together) that kloud evaluates a
// costly rule over: what a loop calling a function over a value costs stays small (cty compares
// values slowly: a loop calling contains over a list of 2,000 items took 8 s on a loaded host;
// a string splits into as many elements as it has bytes).
const (
	smallElements = 200
	smallBytes    = 256
)

// smallValues says whether vals are within smallElements and smallBytes.
func smallValues(vals map[string]cty.Value) bool {
	elems, bytes := 0, 0
	for _, v := range vals {
		n, b := valueSize(v)
		elems, bytes = elems+n, bytes+b
	}
	return elems <= smallElements && bytes <= smallBytes
}

// valueSize is v's elements (nested ones too) and bytes (of its strings).
func valueSize(v cty.Value) (elems, bytes int) {
	if !v.IsKnown() || v.IsNull() {
		return 0, 0
	}
	switch {
	case v.Type() == cty.String:
		return 0, len(v.AsString())
	case v.CanIterateElements():
		for it := v.ElementIterator(); it.Next(); {
			k, e := it.Element()
			n, b := valueSize(e)
			_, kb := valueSize(k)
			elems, bytes = elems+1+n, bytes+b+kb
		}
	}
	return elems, bytes
}

// Preset is a named set of parameter values.
type Preset struct {
	Name        string                     `json:"name"`
	Description string                     `json:"description,omitempty"`
	Default     bool                       `json:"default,omitempty"`
	Values      map[string]json.RawMessage `json:"values"`
	File        string                     `json:"file"`
	Line        int                        `json:"line"`

	values map[string]cty.Value
}

// Params are a template's parameters (in display order: those with an order by it, then the
// others in file order) and presets (in file order).
type Params struct {
	Parameters []Parameter `json:"parameters"`
	Presets    []Preset    `json:"presets"`
}

// ParamError is a value refused for a parameter: Message is the variable's own error_message
// when one of its validation conditions failed.
type ParamError struct {
	Name    string
	Message string
}

func (e *ParamError) Error() string { return fmt.Sprintf("parameter %q: %s", e.Name, e.Message) }

// Params reads the template's variables, kloud_parameter and kloud_preset blocks. skip names the
// variables that are not parameters (kloud gives them values itself: credentials). Problems
// name file:line; several are joined.
func (c *Config) Params(skip func(name string) bool) (*Params, error) {
	var errs []error
	bad := func(file string, line int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...)))
	}
	out := &Params{Parameters: []Parameter{}, Presets: []Preset{}}
	index := map[string]int{}
	var metas, presets []*fileBlock
	for _, f := range c.files {
		blocks, _ := f.blocks()
		for _, b := range blocks {
			switch b.Type {
			case "variable":
				if f.name == GeneratedFile || strings.HasPrefix(b.Labels[0], "kloud_") || skip != nil && skip(b.Labels[0]) {
					continue
				}
				p, perrs := readVariable(f, b)
				errs = append(errs, perrs...)
				index[p.Name] = len(out.Parameters)
				out.Parameters = append(out.Parameters, p)
			case ParameterBlock:
				metas = append(metas, &fileBlock{f, b})
			case PresetBlock:
				presets = append(presets, &fileBlock{f, b})
			}
		}
	}
	seen := map[string]bool{}
	for _, m := range metas {
		name, line := m.b.Labels[0], blockLine(m.b)
		i, ok := index[name]
		if !ok {
			bad(m.f.name, line, "%s %q: the template declares no variable %q (a kloud_parameter describes a variable)", ParameterBlock, name, name)
			continue
		}
		if seen[name] {
			bad(m.f.name, line, "%s %q: declared twice", ParameterBlock, name)
			continue
		}
		seen[name] = true
		errs = append(errs, readMeta(m, &out.Parameters[i])...)
	}
	for _, pb := range presets {
		pr, perrs := readPreset(pb, out.Parameters, index)
		errs = append(errs, perrs...)
		if len(perrs) == 0 {
			for _, o := range out.Presets {
				if o.Name == pr.Name {
					bad(pb.f.name, pr.Line, "%s %q: declared twice", PresetBlock, pr.Name)
				}
				if o.Default && pr.Default {
					bad(pb.f.name, pr.Line, "%s %q: preset %q is the default already; at most one preset is", PresetBlock, pr.Name, o.Name)
				}
			}
		}
		out.Presets = append(out.Presets, pr)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// Those with an order first, by it; then the others in file order.
	sort.SliceStable(out.Parameters, func(i, j int) bool {
		a, b := out.Parameters[i], out.Parameters[j]
		if a.ordered != b.ordered {
			return a.ordered
		}
		return a.Order < b.Order
	})
	return out, nil
}

type fileBlock struct {
	f *file
	b *hcl.Block
}

var variableSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "type"}, {Name: "default"}, {Name: "description"}, {Name: "sensitive"}, {Name: "nullable"}},
	Blocks:     []hcl.BlockHeaderSchema{{Type: "validation"}},
}

var validationSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "condition", Required: true}, {Name: "error_message", Required: true}}}

// readVariable reads a variable block.
func readVariable(f *file, b *hcl.Block) (Parameter, []error) {
	p := Parameter{Parameter: ptype.Parameter{Name: b.Labels[0], Type: "any", Nullable: true, Mutable: true, File: f.name, Line: blockLine(b)}, ty: cty.DynamicPseudoType}
	var errs []error
	bad := func(r hcl.Range, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: variable %q: %s", f.name, r.Start.Line, p.Name, fmt.Sprintf(format, args...)))
	}
	content, _, _ := b.Body.PartialContent(variableSchema)
	if a := content.Attributes["type"]; a != nil {
		src := exprSource(f, a.Expr)
		e, diags := hclsyntax.ParseExpression([]byte(src), f.name, a.Expr.Range().Start)
		if !diags.HasErrors() {
			p.ty, p.defaults, diags = typeexpr.TypeConstraintWithDefaults(e)
		}
		if diags.HasErrors() {
			bad(a.Range, "type: %s", diags.Error())
		} else {
			p.Type = typeexpr.TypeString(p.ty)
		}
	}
	str := func(name string) string {
		a := content.Attributes[name]
		if a == nil {
			return ""
		}
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() || !v.Type().Equals(cty.String) || v.IsNull() {
			bad(a.Range, "%s must be a literal string", name)
			return ""
		}
		return v.AsString()
	}
	flag := func(name string, def bool) bool {
		a := content.Attributes[name]
		if a == nil {
			return def
		}
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() || !v.Type().Equals(cty.Bool) || v.IsNull() {
			bad(a.Range, "%s must be true or false", name)
			return def
		}
		return v.True()
	}
	p.Description = str("description")
	p.Sensitive = flag("sensitive", false)
	p.Nullable = flag("nullable", true)
	if a := content.Attributes["default"]; a != nil {
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() {
			bad(a.Range, "default must be a literal value: %s", diags.Error())
		} else if v, err := p.convert(v); err != nil {
			bad(a.Range, "default: %s", err)
		} else {
			p.def = v
			if !p.Sensitive {
				p.Default = jsonOf(v)
			}
		}
	} else {
		p.Required = true
	}
	for _, vb := range content.Blocks {
		vc, diags := vb.Body.Content(validationSchema)
		if diags.HasErrors() {
			bad(vb.DefRange, "validation: %s", diags.Error())
			continue
		}
		cond, msg := vc.Attributes["condition"], vc.Attributes["error_message"]
		r := rule{cond: cond.Expr, msg: msg.Expr}
		r.costly, r.nested = costlyRule(exprSource(f, cond.Expr), exprSource(f, msg.Expr))
		if v, diags := msg.Expr.Value(nil); !diags.HasErrors() && v.Type().Equals(cty.String) && v.IsKnown() && !v.IsNull() {
			r.msgText = v.AsString()
		} else {
			r.msgText = exprSource(f, msg.Expr)
		}
		p.rules = append(p.rules, r)
		p.Validations = append(p.Validations, Validation{Condition: exprSource(f, cond.Expr), ErrorMessage: r.msgText})
	}
	return p, errs
}

// readMeta reads a kloud_parameter block into p.
func readMeta(m *fileBlock, p *Parameter) []error {
	var errs []error
	bad := m.literalArgs(&errs, fmt.Sprintf("%s %q", ParameterBlock, p.Name), ParameterBlock+" takes only display_name, choices, mutable and order",
		func(n string, line int, v cty.Value, bad func(int, string, ...any)) {
			switch n {
			case "display_name":
				setString(&p.DisplayName, n, v, line, bad)
			case "mutable":
				setBool(&p.Mutable, n, v, line, bad)
			case "order":
				o, ok := wholeNumber(v)
				if !ok {
					bad(line, "order must be a whole number")
					return
				}
				p.Order, p.ordered = o, true
			case "choices":
				if !v.CanIterateElements() || v.Type().IsMapType() || v.Type().IsObjectType() || v.LengthInt() == 0 {
					bad(line, "choices must be a list of values of the variable's type (%s)", p.Type)
					return
				}
				for it := v.ElementIterator(); it.Next(); {
					_, ev := it.Element()
					cv, err := p.convert(ev)
					if err != nil {
						bad(line, "choice %s: %s", jsonOf(ev), err)
						continue
					}
					p.choices = append(p.choices, cv)
					p.Choices = append(p.Choices, jsonOf(cv))
				}
			default:
				bad(line, "argument %q: %s takes only display_name, choices, mutable and order", n, ParameterBlock)
			}
		})
	if p.def != cty.NilVal && len(p.choices) > 0 && !p.isChoice(p.def) {
		bad(blockLine(m.b), "the variable's default %s is not one of the choices", jsonOf(p.def))
	}
	return errs
}

// readPreset reads a kloud_preset block; its values are checked as Resolve checks values.
func readPreset(pb *fileBlock, params []Parameter, index map[string]int) (Preset, []error) {
	pr := Preset{Name: pb.b.Labels[0], Values: map[string]json.RawMessage{}, File: pb.f.name, Line: blockLine(pb.b), values: map[string]cty.Value{}}
	var errs []error
	pb.literalArgs(&errs, fmt.Sprintf("%s %q", PresetBlock, pr.Name), "a preset takes only default, description and values (values = { name = value })",
		func(n string, line int, v cty.Value, bad func(int, string, ...any)) {
			switch n {
			case "default":
				setBool(&pr.Default, n, v, line, bad)
			case "description":
				setString(&pr.Description, n, v, line, bad)
			case "values":
				if !v.Type().IsObjectType() && !v.Type().IsMapType() {
					bad(line, "values must be an object: { name = value, ... }")
					return
				}
				for k, ev := range v.AsValueMap() {
					i, ok := index[k]
					if !ok {
						bad(line, "values: the template has no parameter %q", k)
						continue
					}
					cv, err := params[i].check(ev)
					if err != nil {
						bad(line, "values: %s", err)
						continue
					}
					pr.values[k], pr.Values[k] = cv, jsonOf(cv)
					if params[i].Sensitive {
						pr.Values[k] = json.RawMessage(`"(sensitive)"`)
					}
				}
			default:
				bad(line, "argument %q: a preset takes only default, description and values", n)
			}
		})
	return pr, errs
}

// literalArgs reads the arguments of a kloud block, which are literal values: each one's value
// goes to each, in name order; nested blocks and non-literal values are refused (only says
// what the block takes). Problems are appended to errs as file:line: where: message; bad is
// how each adds its own.
func (fb *fileBlock) literalArgs(errs *[]error, where, only string, each func(name string, line int, v cty.Value, bad func(int, string, ...any))) func(int, string, ...any) {
	bad := func(line int, format string, args ...any) {
		*errs = append(*errs, fmt.Errorf("%s:%d: %s: %s", fb.f.name, line, where, fmt.Sprintf(format, args...)))
	}
	if sb, ok := fb.b.Body.(*hclsyntax.Body); ok {
		for _, b := range sb.Blocks {
			bad(b.TypeRange.Start.Line, "block %q: %s", b.Type, only)
		}
	}
	attrs := attributes(fb.b.Body)
	for _, n := range slices.Sorted(maps.Keys(attrs)) {
		a := attrs[n]
		line := a.NameRange.Start.Line
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() || !v.IsWhollyKnown() || v.IsNull() {
			bad(line, "%s must be a literal value", n)
			continue
		}
		each(n, line, v, bad)
	}
	return bad
}

// setString sets *dst to v, a string, or says argument name must be one.
func setString(dst *string, name string, v cty.Value, line int, bad func(int, string, ...any)) {
	if !v.Type().Equals(cty.String) {
		bad(line, "%s must be a string", name)
		return
	}
	*dst = v.AsString()
}

// setBool sets *dst to v, a bool, or says argument name must be true or false.
func setBool(dst *bool, name string, v cty.Value, line int, bad func(int, string, ...any)) {
	if !v.Type().Equals(cty.Bool) {
		bad(line, "%s must be true or false", name)
		return
	}
	*dst = v.True()
}

func wholeNumber(v cty.Value) (int, bool) {
	if !v.Type().Equals(cty.Number) {
		return 0, false
	}
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		return 0, false
	}
	i, acc := bf.Int64()
	if acc != big.Exact || i < -1<<31 || i > 1<<31-1 {
		return 0, false
	}
	return int(i), true
}

func jsonOf(v cty.Value) json.RawMessage {
	b, err := ctyjson.Marshal(v, v.Type())
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}

// convert converts v to the parameter's type (with the defaults of optional object attributes).
func (p *Parameter) convert(v cty.Value) (cty.Value, error) {
	if p.defaults != nil {
		v = p.defaults.Apply(v)
	}
	cv, err := convert.Convert(v, p.ty)
	if err != nil {
		return cty.NilVal, fmt.Errorf("a %s is needed: %s", p.Type, err.Error())
	}
	return cv, nil
}

func (p *Parameter) isChoice(v cty.Value) bool {
	for _, c := range p.choices {
		if c.Equals(v).True() {
			return true
		}
	}
	return false
}

// check converts v to the parameter's type and checks it against the choices; the
// validation conditions are Resolve's (they may refer to other variables).
func (p *Parameter) check(v cty.Value) (cty.Value, error) {
	if v.IsNull() {
		if !p.Nullable {
			return cty.NilVal, errors.New("the variable is not nullable: a value is needed")
		}
		return cty.NilVal, errors.New("null is not a value kloud passes on: leave the parameter out for its default")
	}
	if p.ty == cty.DynamicPseudoType {
		// A variable without a type takes strings (what its -var form reaches Terraform as).
		sv, err := convert.Convert(v, cty.String)
		if err != nil {
			return cty.NilVal, errors.New("a string is needed (the variable declares no type)")
		}
		v = sv
	}
	cv, err := p.convert(v)
	if err != nil {
		if p.Sensitive {
			return cty.NilVal, fmt.Errorf("a %s is needed", p.Type)
		}
		return cty.NilVal, err
	}
	if len(p.choices) > 0 && !p.isChoice(cv) {
		var cs []string
		for _, c := range p.Choices {
			cs = append(cs, string(c))
		}
		if p.Sensitive {
			return cty.NilVal, errors.New("the value is not one of the choices")
		}
		return cty.NilVal, fmt.Errorf("%s is not one of the choices: %s", jsonOf(cv), strings.Join(cs, ", "))
	}
	return cv, nil
}

// Param returns the parameter named name.
func (ps *Params) Param(name string) (*Parameter, bool) {
	for i := range ps.Parameters {
		if ps.Parameters[i].Name == name {
			return &ps.Parameters[i], true
		}
	}
	return nil, false
}

// Preset returns the preset named name, or (name "") the default preset; nil when there is
// none.
func (ps *Params) Preset(name string) *Preset {
	for i := range ps.Presets {
		if name == "" && ps.Presets[i].Default || name != "" && ps.Presets[i].Name == name {
			return &ps.Presets[i]
		}
	}
	return nil
}

// Input is what a stack's creator gives: typed values, values as strings (Terraform's -var
// form: a string as it is, other types in HCL or JSON syntax, "4", "[\"a\"]"), and a preset.
type Input struct {
	// Values are typed values (JSON) of parameters; unknown names are refused.
	Values map[string]json.RawMessage
	// Strings are values in -var form. Names that are no parameter pass through unchecked
	// (the stack's variables before parameters: kloud leaves them to Terraform).
	Strings map[string]string
	// Preset names the preset whose values apply under Values and Strings; nil: the
	// template's default preset (if any); "": none.
	Preset *string
}

// Resolve checks in against the parameters: each value converted to its variable's type, within
// its choices, every validation condition true (evaluated with HCL and the functions of
// Functions; a condition that uses another function, or a variable without a known value, is
// left to Terraform's plan, which evaluates it again). It returns the values to pass on in -var
// form (those of the preset and of in; defaults are Terraform's), or a *ParamError (several
// joined) for the first problem of each parameter. Required parameters without a value are
// refused.
func (ps *Params) Resolve(in Input) (map[string]string, error) {
	vals := map[string]cty.Value{}
	var errs []error
	refuse := func(name, format string, args ...any) {
		errs = append(errs, &ParamError{Name: name, Message: fmt.Sprintf(format, args...)})
	}
	if in.Preset == nil || *in.Preset != "" {
		name := ""
		if in.Preset != nil {
			name = *in.Preset
		}
		pr := ps.Preset(name)
		if pr == nil && name != "" {
			var names []string
			for _, p := range ps.Presets {
				names = append(names, p.Name)
			}
			return nil, fmt.Errorf("the template has no preset %q (presets: %s)", name, strings.Join(names, ", "))
		}
		if pr != nil {
			maps.Copy(vals, pr.values)
		}
	}
	out := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(in.Strings)) {
		p, ok := ps.Param(k)
		if !ok {
			out[k] = in.Strings[k]
			continue
		}
		v, err := p.parseString(in.Strings[k])
		if err == nil {
			v, err = p.check(v)
		}
		if err != nil {
			refuse(k, "%s", err)
			continue
		}
		vals[k] = v
	}
	for _, k := range slices.Sorted(maps.Keys(in.Values)) {
		p, ok := ps.Param(k)
		if !ok {
			var names []string
			for _, p := range ps.Parameters {
				names = append(names, p.Name)
			}
			refuse(k, "the template has no such parameter (its parameters: %s)", strings.Join(names, ", "))
			continue
		}
		v, err := ctyFromJSON(in.Values[k])
		if err == nil {
			v, err = p.check(v)
		}
		if err != nil {
			refuse(k, "%s", err)
			continue
		}
		vals[k] = v
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// Every variable's value (given, else its default, else unknown) for the conditions.
	all := map[string]cty.Value{}
	for _, p := range ps.Parameters {
		switch v, ok := vals[p.Name]; {
		case ok:
			all[p.Name] = v
		case p.def != cty.NilVal:
			all[p.Name] = p.def
		case p.Required:
			refuse(p.Name, "a value is required%s", p.about())
			all[p.Name] = cty.UnknownVal(p.ty)
		}
	}
	for k := range in.Strings {
		if _, ok := all[k]; !ok {
			all[k] = cty.UnknownVal(cty.DynamicPseudoType) // kloud's own, or Terraform's to refuse
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{"var": cty.DynamicVal}, Functions: Functions()}
	if len(all) > 0 {
		ctx.Variables["var"] = cty.ObjectVal(all)
	}
	small := smallValues(all)
	for _, p := range ps.Parameters {
		if _, given := vals[p.Name]; !given {
			continue
		}
		if msg, failed := p.validate(ctx, small); failed {
			refuse(p.Name, "%s", msg)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for k, v := range vals {
		out[k] = varString(v)
	}
	return out, nil
}

func (p *Parameter) about() string {
	var b strings.Builder
	if p.Description != "" {
		fmt.Fprintf(&b, " (%s)", p.Description)
	}
	if len(p.Choices) > 0 {
		var cs []string
		for _, c := range p.Choices {
			cs = append(cs, string(c))
		}
		fmt.Fprintf(&b, "; choices: %s", strings.Join(cs, ", "))
	}
	return b.String()
}

// validate evaluates p's validation conditions; failed with Terraform's error_message when one
// is false. Conditions that cannot be evaluated here are left to Terraform.
func (p *Parameter) validate(ctx *hcl.EvalContext, small bool) (string, bool) {
	for _, r := range p.rules {
		if r.nested || r.costly && !small {
			continue // Terraform's plan checks it, in its sandbox (rule.costly)
		}
		v, diags := r.cond.Value(ctx)
		if diags.HasErrors() || !v.IsKnown() || v.IsNull() {
			continue // an unknown function or variable: Terraform's plan checks it
		}
		b, err := convert.Convert(v, cty.Bool)
		if err != nil || b.IsNull() || b.True() {
			continue
		}
		msg := r.msgText
		if p.Sensitive {
			return msg, true // as written: an interpolated message could show the value
		}
		if mv, diags := r.msg.Value(ctx); !diags.HasErrors() && mv.Type().Equals(cty.String) && mv.IsKnown() && !mv.IsNull() {
			msg = mv.AsString()
		}
		return msg, true
	}
	return "", false
}

// parseString reads a value in Terraform's -var form: as it is for string (and untyped)
// variables, otherwise an HCL expression (JSON is one).
func (p *Parameter) parseString(s string) (cty.Value, error) {
	if p.ty == cty.String || p.ty == cty.DynamicPseudoType {
		return cty.StringVal(s), nil
	}
	return parseVarString(s)
}

func parseVarString(s string) (cty.Value, error) {
	e, diags := hclsyntax.ParseExpression([]byte(s), "value", hcl.InitialPos)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("not a value: %s", diags.Error())
	}
	v, diags := e.Value(nil)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("not a literal value: %s", diags.Error())
	}
	return v, nil
}

func ctyFromJSON(raw json.RawMessage) (cty.Value, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return cty.NilVal, errors.New("empty value")
	}
	ty, err := ctyjson.ImpliedType(raw)
	if err != nil {
		return cty.NilVal, fmt.Errorf("not a JSON value: %w", err)
	}
	return ctyjson.Unmarshal(raw, ty)
}

// varString is v in -var form.
func varString(v cty.Value) string {
	if v.Type() == cty.String {
		return v.AsString()
	}
	return string(jsonOf(v))
}

// TypedValue returns the value for Terraform's JSON var file of variable name given s in -var
// form: s itself for string and untyped variables (and names the template does not declare),
// otherwise s parsed and converted to the variable's type (a number stays a number, a list a
// list).
func (c *Config) TypedValue(name, s string) (any, error) {
	decl, ok := c.variable(name)
	if !ok || decl.Type == "" {
		return s, nil
	}
	e, diags := hclsyntax.ParseExpression([]byte(decl.Type), decl.File, hcl.InitialPos)
	if diags.HasErrors() {
		return s, nil // Terraform reports the bad type
	}
	ty, defs, diags := typeexpr.TypeConstraintWithDefaults(e)
	if diags.HasErrors() {
		return s, nil
	}
	p := Parameter{Parameter: ptype.Parameter{Name: name, Type: typeexpr.TypeString(ty)}, ty: ty, defaults: defs}
	val, err := p.parseString(s)
	if err == nil {
		val, err = p.convert(val)
	}
	if err != nil {
		return nil, &ParamError{Name: name, Message: err.Error()}
	}
	if ty == cty.String || ty == cty.DynamicPseudoType {
		return s, nil
	}
	var out any
	if err := json.Unmarshal(jsonOf(val), &out); err != nil {
		return nil, err
	}
	return out, nil
}

// RemoveParams takes the kloud_parameter and kloud_preset blocks out of the files: Terraform
// never sees them (as RemoveBuckets does for bucket claims).
func (c *Config) RemoveParams() error {
	for _, f := range c.files {
		var blocks []*hcl.Block
		bs, _ := f.blocks()
		for _, b := range bs {
			if b.Type == ParameterBlock || b.Type == PresetBlock {
				blocks = append(blocks, b)
			}
		}
		if len(blocks) == 0 {
			continue
		}
		old := f.src
		var err error
		if f.json {
			f.src, err = removeJSONTop(f.src, ParameterBlock, PresetBlock)
		} else {
			f.src, err = removeHCLBlocks(f, blocks, "# kloud_parameter/kloud_preset: read by kloud, not Terraform")
		}
		if err != nil {
			return fmt.Errorf("%s: remove kloud_parameter and kloud_preset blocks: %w", f.name, err)
		}
		if diags := f.parse(); diags.HasErrors() {
			f.src = old
			f.parse()
			return fmt.Errorf("removing kloud_parameter and kloud_preset blocks from %s produced invalid syntax: %w", f.name, diags)
		}
	}
	return c.reindex()
}

// removeJSONTop deletes top-level keys of a .tf.json file.
func removeJSONTop(src []byte, keys ...string) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(src, &top); err != nil {
		return nil, err
	}
	for _, k := range keys {
		delete(top, k)
	}
	return MarshalJSON(top)
}
