package stackbuild

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
)

// stack.scale (issue 13 §1): a machine resource's count changes in the stack's own files, or,
// when the count is a variable the files declare, in the stack's variables; kloud's stack.scale
// (kloud/stacks_scale.go) then starts an update job with them.

// ScaleFiles returns files and vars with the count of machine resource name (of one of types)
// set to n: in place of a literal count, or as the value of the variable the count is.
func ScaleFiles(files []model.File, vars map[string]string, types []string, name string, n int) ([]model.File, map[string]string, error) {
	out := slices.Clone(files)
	declared := map[string]bool{}
	type found struct {
		file  int
		typ   string
		count *hcl.Attribute
		src   []byte
	}
	var hit *found
	for i, f := range files {
		var body hcl.Body
		var diags hcl.Diagnostics
		src := []byte(f.Content)
		switch {
		case strings.HasSuffix(f.Name, ".tf.json"):
			var hf *hcl.File
			hf, diags = hcljson.Parse(src, f.Name)
			if hf != nil {
				body = hf.Body
			}
		case strings.HasSuffix(f.Name, ".tf"):
			var hf *hcl.File
			hf, diags = hclsyntax.ParseConfig(src, f.Name, hcl.InitialPos)
			if hf != nil {
				body = hf.Body
			}
		default:
			continue
		}
		if diags.HasErrors() || body == nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", f.Name, diags.Error(), kite.ErrInvalidParams)
		}
		content, _, diags := body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
			{Type: "resource", LabelNames: []string{"type", "name"}},
			{Type: "variable", LabelNames: []string{"name"}},
		}})
		if diags.HasErrors() {
			return nil, nil, fmt.Errorf("%s: %s: %w", f.Name, diags.Error(), kite.ErrInvalidParams)
		}
		for _, b := range content.Blocks {
			if b.Type == "variable" {
				declared[b.Labels[0]] = true
				continue
			}
			if b.Labels[1] != name || !slices.Contains(types, b.Labels[0]) {
				continue
			}
			attrs, _ := b.Body.JustAttributes()
			hit = &found{file: i, typ: b.Labels[0], count: attrs["count"], src: src}
		}
	}
	if hit == nil {
		return nil, nil, fmt.Errorf("the stack's files declare no machine resource %q (machine resource types: %s): %w", name, strings.Join(types, ", "), kite.ErrNotFound)
	}
	addr := hit.typ + "." + name
	if hit.count == nil {
		return nil, nil, fmt.Errorf("%s has no count: it is one machine; add `count = 1` to it in the template (and update the stack) to scale it: %w", addr, kite.ErrInvalidParams)
	}
	e := hit.count.Expr
	rng := e.Range()
	text := string(rng.SliceBytes(hit.src))
	if len(e.Variables()) == 0 {
		v, diags := e.Value(nil)
		if !diags.HasErrors() && v.Type() == cty.Number {
			out[hit.file].Content = string(hit.src[:rng.Start.Byte]) + strconv.Itoa(n) + string(hit.src[rng.End.Byte:])
			return out, vars, nil
		}
	}
	if tr := e.Variables(); len(tr) == 1 && tr[0].RootName() == "var" && len(tr[0]) == 2 {
		if a, ok := tr[0][1].(hcl.TraverseAttr); ok && (text == "var."+a.Name || text == `"${var.`+a.Name+`}"`) {
			if !declared[a.Name] {
				return nil, nil, fmt.Errorf("%s: count is var.%s, which the files do not declare: %w", addr, a.Name, kite.ErrInvalidParams)
			}
			nv := maps.Clone(vars)
			if nv == nil {
				nv = map[string]string{}
			}
			nv[a.Name] = strconv.Itoa(n)
			return out, nv, nil
		}
	}
	return nil, nil, fmt.Errorf("%s: count is the expression `%s`; kloud can change only a literal count or a variable (count = var.NAME); edit the template instead: %w", addr, text, kite.ErrInvalidParams)
}
