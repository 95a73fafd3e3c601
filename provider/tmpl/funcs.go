package tmpl

import (
	"strings"

	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// Functions returns the functions kloud evaluates variables' validation conditions with: those
// of Terraform's built-in functions that are cty's stdlib functions in Terraform too, can and
// try (HCL's tryfunc, as Terraform), and kloud's versions of length, startswith, endswith,
// alltrue and anytrue with Terraform's meaning. A condition calling any other function is left
// to Terraform's plan. Left out on purpose, since kloud evaluates in its own process what any
// team member writes: functions whose result can be made huge from a small call (range,
// setproduct, format and formatlist with a width). Conditions with loops in loops are left to
// Terraform too (rule.loops), and values are bounded (MaxValueElements): what one loop over a
// value costs stays small. A new map each call.
func Functions() map[string]function.Function {
	return map[string]function.Function{
		"abs": stdlib.AbsoluteFunc, "ceil": stdlib.CeilFunc, "floor": stdlib.FloorFunc, "log": stdlib.LogFunc,
		"max": stdlib.MaxFunc, "min": stdlib.MinFunc, "parseint": stdlib.ParseIntFunc, "pow": stdlib.PowFunc,
		"signum": stdlib.SignumFunc,
		"chomp":  stdlib.ChompFunc,
		"indent": stdlib.IndentFunc, "join": stdlib.JoinFunc, "lower": stdlib.LowerFunc, "regex": stdlib.RegexFunc,
		"regexall": stdlib.RegexAllFunc, "split": stdlib.SplitFunc, "strrev": stdlib.ReverseFunc,
		"substr": stdlib.SubstrFunc, "title": stdlib.TitleFunc, "trim": stdlib.TrimFunc,
		"trimprefix": stdlib.TrimPrefixFunc, "trimsuffix": stdlib.TrimSuffixFunc, "trimspace": stdlib.TrimSpaceFunc,
		"upper":     stdlib.UpperFunc,
		"chunklist": stdlib.ChunklistFunc, "coalescelist": stdlib.CoalesceListFunc, "compact": stdlib.CompactFunc,
		"concat": stdlib.ConcatFunc, "contains": stdlib.ContainsFunc, "distinct": stdlib.DistinctFunc,
		"element": stdlib.ElementFunc, "flatten": stdlib.FlattenFunc, "keys": stdlib.KeysFunc,
		"merge": stdlib.MergeFunc, "reverse": stdlib.ReverseListFunc,
		"setintersection": stdlib.SetIntersectionFunc,
		"setsubtract":     stdlib.SetSubtractFunc, "setunion": stdlib.SetUnionFunc, "slice": stdlib.SliceFunc,
		"sort": stdlib.SortFunc, "values": stdlib.ValuesFunc, "zipmap": stdlib.ZipmapFunc,
		"jsondecode": stdlib.JSONDecodeFunc, "jsonencode": stdlib.JSONEncodeFunc,
		"tostring": stdlib.MakeToFunc(cty.String), "tonumber": stdlib.MakeToFunc(cty.Number),
		"tobool": stdlib.MakeToFunc(cty.Bool), "tolist": stdlib.MakeToFunc(cty.List(cty.DynamicPseudoType)),
		"toset": stdlib.MakeToFunc(cty.Set(cty.DynamicPseudoType)), "tomap": stdlib.MakeToFunc(cty.Map(cty.DynamicPseudoType)),
		"can": tryfunc.CanFunc, "try": tryfunc.TryFunc,
		"length": lengthFunc, "startswith": prefixFunc(strings.HasPrefix), "endswith": prefixFunc(strings.HasSuffix),
		"alltrue": boolsFunc(true), "anytrue": boolsFunc(false),
	}
}

// lengthFunc is Terraform's length: characters of a string, elements of a collection.
var lengthFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "value", Type: cty.DynamicPseudoType, AllowDynamicType: true, AllowUnknown: true}},
	Type:   function.StaticReturnType(cty.Number),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		if args[0].Type() == cty.String {
			return stdlib.Strlen(args[0])
		}
		return stdlib.Length(args[0])
	},
})

// prefixFunc is Terraform's startswith (strings.HasPrefix) or endswith (strings.HasSuffix).
func prefixFunc(has func(s, affix string) bool) function.Function {
	return function.New(&function.Spec{
		Params: []function.Parameter{{Name: "str", Type: cty.String}, {Name: "affix", Type: cty.String}},
		Type:   function.StaticReturnType(cty.Bool),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			return cty.BoolVal(has(args[0].AsString(), args[1].AsString())), nil
		},
	})
}

// boolsFunc is Terraform's alltrue (all) or anytrue: of a list of bools, true for an empty one
// with alltrue and false with anytrue.
func boolsFunc(all bool) function.Function {
	return function.New(&function.Spec{
		Params: []function.Parameter{{Name: "list", Type: cty.List(cty.Bool)}},
		Type:   function.StaticReturnType(cty.Bool),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			for it := args[0].ElementIterator(); it.Next(); {
				_, v := it.Element()
				if !v.IsKnown() {
					return cty.UnknownVal(cty.Bool), nil
				}
				switch {
				case v.IsNull() && all:
					return cty.False, nil
				case v.IsNull():
				case v.True() != all:
					return cty.BoolVal(!all), nil
				}
			}
			return cty.BoolVal(all), nil
		},
	})
}
