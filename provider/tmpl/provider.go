package tmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"
)

// ProviderConfig is a Terraform provider that kloud configures itself in a stack's template (the
// local provider's kloudlocal, the vagrant provider's kloudvagrant, the docker provider's docker):
// the template may have an empty provider block for it, or none, and a required_providers entry
// with the right source, or none; ConfigureProvider writes the rest.
type ProviderConfig struct {
	// Name is the provider's local name ("kloudlocal"); Source and Version go into
	// required_providers ("kloud/kloudlocal", "0.1.0").
	Name, Source, Version string
	// File is the generated file ConfigureProvider writes ("kloud_local.tf.json"). User files
	// may not use the name (the caller checks).
	File string
	// Comment is the generated file's "//" property: who wrote it and why.
	Comment string
	// Args are the provider block's arguments as .tf.json string values: "${var.x}" for a
	// variable, EscapeTemplate(v) for a literal.
	Args map[string]string
}

// ConfigureProvider removes the user's provider block of p.Name (which must be empty) and writes
// p.File with the provider configured with p.Args, plus the required_providers entry unless the
// user declared it (with the right source). Removed HCL blocks become a comment with the same
// number of lines, so Terraform's messages still point at the right lines. files is not changed;
// the result holds every file of it, and p.File.
func ConfigureProvider(files map[string][]byte, p ProviderConfig) (map[string][]byte, error) {
	out := make(map[string][]byte, len(files)+1)
	declared := false
	for _, name := range slices.Sorted(maps.Keys(files)) {
		src := files[name]
		out[name] = src
		if name == GeneratedFile {
			continue
		}
		isJSON := strings.HasSuffix(name, ".tf.json")
		var f *hcl.File
		var diags hcl.Diagnostics
		if isJSON {
			f, diags = hcljson.Parse(src, name)
		} else {
			f, diags = hclsyntax.ParseConfig(src, name, hcl.InitialPos)
		}
		if diags.HasErrors() {
			return nil, diags
		}
		content, _, diags := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
			{Type: "provider", LabelNames: []string{"name"}}, {Type: "terraform"},
		}})
		if diags.HasErrors() {
			return nil, diags
		}
		var remove []hcl.Range
		for _, blk := range content.Blocks {
			switch blk.Type {
			case "terraform":
				ok, err := p.required(blk)
				if err != nil {
					return nil, err
				}
				declared = declared || ok
			case "provider":
				if blk.Labels[0] != p.Name {
					continue
				}
				if err := p.checkBlock(blk); err != nil {
					return nil, err
				}
				remove = append(remove, blk.DefRange)
			}
		}
		if len(remove) == 0 {
			continue
		}
		var err error
		if isJSON {
			out[name], err = p.removeJSON(src)
		} else {
			out[name], err = p.removeHCL(f, src, remove)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: remove provider %q: %w", name, p.Name, err)
		}
	}

	gen := map[string]any{
		"//":       p.Comment,
		"provider": map[string]any{p.Name: p.Args},
	}
	if !declared {
		gen["terraform"] = map[string]any{"required_providers": map[string]any{
			p.Name: map[string]string{"source": p.Source, "version": p.Version},
		}}
	}
	b, err := MarshalJSON(gen)
	if err != nil {
		return nil, err
	}
	out[p.File] = b
	return out, nil
}

// required reports whether a terraform block declares the provider in required_providers;
// declared with another source, it is an error.
func (p *ProviderConfig) required(blk *hcl.Block) (bool, error) {
	content, _, diags := blk.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "required_providers"}}})
	if diags.HasErrors() {
		return false, diags
	}
	found := false
	for _, rp := range content.Blocks {
		attrs, diags := rp.Body.JustAttributes()
		if diags.HasErrors() {
			return false, diags
		}
		a, ok := attrs[p.Name]
		if !ok {
			continue
		}
		v, diags := a.Expr.Value(nil)
		src := ""
		if !diags.HasErrors() && v.IsWhollyKnown() && !v.IsNull() && v.Type().IsObjectType() && v.Type().HasAttribute("source") {
			if s := v.GetAttr("source"); s.Type() == cty.String && !s.IsNull() {
				src = s.AsString()
			}
		}
		if strings.TrimPrefix(src, "registry.terraform.io/") != p.Source {
			return false, fmt.Errorf("%s: required_providers.%s must have source = %q (found %q); or leave it out and kloud declares it",
				a.Range, p.Name, p.Source, src)
		}
		found = true
	}
	return found, nil
}

// checkBlock accepts an empty provider block: kloud configures the provider.
func (p *ProviderConfig) checkBlock(blk *hcl.Block) error {
	attrs, diags := blk.Body.JustAttributes()
	if diags.HasErrors() {
		return fmt.Errorf("%s: provider %q: %w", blk.DefRange, p.Name, diags)
	}
	if len(attrs) == 0 {
		return nil
	}
	n := slices.Sorted(maps.Keys(attrs))[0]
	return fmt.Errorf("%s: provider %q: kloud configures this provider itself; remove %s (an empty block, or none, is fine)", attrs[n].Range, p.Name, n)
}

// removeHCL replaces the blocks whose definition ranges are given with a comment, keeping the
// file's line count so Terraform's messages still point at the right lines.
func (p *ProviderConfig) removeHCL(f *hcl.File, src []byte, defs []hcl.Range) ([]byte, error) {
	body, ok := f.Body.(*hclsyntax.Body)
	if !ok {
		return nil, fmt.Errorf("unexpected body type %T", f.Body)
	}
	var ranges []hcl.Range
	for _, blk := range body.Blocks {
		for _, d := range defs {
			if blk.DefRange() == d {
				ranges = append(ranges, blk.Range())
			}
		}
	}
	if len(ranges) != len(defs) {
		return nil, fmt.Errorf("found %d of %d blocks", len(ranges), len(defs))
	}
	sort.Slice(ranges, func(i, j int) bool { return ranges[i].Start.Byte > ranges[j].Start.Byte })
	out := bytes.Clone(src)
	for _, r := range ranges {
		old := out[r.Start.Byte:r.End.Byte]
		text := fmt.Sprintf("# provider %q: configured by kloud in %s", p.Name, p.File) + strings.Repeat("\n", bytes.Count(old, []byte{'\n'}))
		out = append(out[:r.Start.Byte:r.Start.Byte], append([]byte(text), out[r.End.Byte:]...)...)
	}
	return out, nil
}

// removeJSON deletes provider.<Name> from a .tf.json file (the object or the array form of
// "provider"). The file is re-encoded; every other value keeps its bytes' meaning.
func (p *ProviderConfig) removeJSON(src []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(src, &top); err != nil {
		return nil, err
	}
	raw := bytes.TrimSpace(top["provider"])
	drop := func(obj json.RawMessage) (map[string]json.RawMessage, error) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(obj, &m); err != nil {
			return nil, err
		}
		delete(m, p.Name)
		return m, nil
	}
	var newProv any
	if len(raw) > 0 && raw[0] == '[' {
		var arr []json.RawMessage
		if err := json.Unmarshal(raw, &arr); err != nil {
			return nil, err
		}
		var kept []map[string]json.RawMessage
		for _, el := range arr {
			m, err := drop(el)
			if err != nil {
				return nil, err
			}
			if len(m) > 0 {
				kept = append(kept, m)
			}
		}
		if len(kept) > 0 {
			newProv = kept
		}
	} else {
		m, err := drop(raw)
		if err != nil {
			return nil, err
		}
		if len(m) > 0 {
			newProv = m
		}
	}
	if newProv == nil {
		delete(top, "provider")
	} else {
		b, err := json.Marshal(newProv)
		if err != nil {
			return nil, err
		}
		top["provider"] = b
	}
	return MarshalJSON(top)
}

// MarshalJSON encodes v indented (a .tf.json file), without HTML escapes (user data keeps its < and &).
func MarshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// EscapeTemplate escapes HCL template sequences, so a value reaches a provider literally from a
// .tf.json string.
func EscapeTemplate(v string) string {
	return strings.NewReplacer("${", "$${", "%{", "%%{").Replace(v)
}
