package tmpl

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// AddBlocks adds nested blocks of type blockType to resource typ.name, one per element of
// blocks, each with the given arguments: name → a Terraform expression in native syntax (a
// quoted string, a bool, var.x, var.x[count.index]). In a .tf.json file the blocks are inserted
// as one property "blockType": [ {...}, ... ] whose values are "${expression}" strings. The
// resource must not have blocks of that type already (the caller checks that the user wrote
// none): Terraform would merge them.
func (c *Config) AddBlocks(typ, name, blockType string, blocks []map[string]string) error {
	if len(blocks) == 0 {
		return nil
	}
	if !hclsyntax.ValidIdentifier(blockType) {
		return fmt.Errorf("block type %q is not a valid identifier", blockType)
	}
	r, err := c.resource(typ, name)
	if err != nil {
		return err
	}
	f := r.f
	var e edit
	if f.json {
		var elems []string
		for _, b := range blocks {
			var props []string
			for _, k := range sortedKeys(b) {
				props = append(props, jsonQuote(k)+": "+jsonQuote("${"+b[k]+"}"))
			}
			elems = append(elems, "{"+strings.Join(props, ", ")+"}")
		}
		open := jsonBodyOpen(f.src, r.block)
		if open < 0 {
			return fmt.Errorf("resource %q %q: body of the block not found in %s", typ, name, f.name)
		}
		e = jsonInsert(f.src, open, jsonQuote(blockType), "["+strings.Join(elems, ", ")+"]")
	} else {
		sb, ok := r.block.Body.(*hclsyntax.Body)
		if !ok {
			return fmt.Errorf("unexpected body type %T", r.block.Body)
		}
		blk := nativeBlock(f, r.block)
		if blk == nil {
			return fmt.Errorf("resource %q %q: block not found in %s", typ, name, f.name)
		}
		ind := lineIndent(f.src, blk.TypeRange.Start.Byte) + "  "
		var text []string
		for _, b := range blocks {
			lines := []string{blockType + " {"}
			for _, k := range sortedKeys(b) {
				lines = append(lines, ind+"  "+k+" = "+b[k])
			}
			text = append(text, strings.Join(append(lines, ind+"}"), "\n"))
		}
		e = hclBlockInsert(f.src, blk, sb, strings.Join(text, "\n"+ind))
	}
	old := f.src
	f.src = e.apply(f.src)
	if diags := f.parse(); diags.HasErrors() {
		bad := f.src
		f.src = old
		f.parse()
		return fmt.Errorf("adding %s blocks to resource %q %q produced invalid syntax: %w\n%s", blockType, typ, name, diags, bad)
	}
	return c.reindex()
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
