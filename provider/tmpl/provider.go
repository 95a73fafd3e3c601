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
		f, blocks, err := providerBlocks(name, src)
		if err != nil {
			return nil, err
		}
		var remove []hcl.Range
		for _, blk := range blocks {
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
		gen["terraform"] = map[string]any{"required_providers": map[string]any{p.Name: p.requirement()}}
	}
	b, err := MarshalJSON(gen)
	if err != nil {
		return nil, err
	}
	out[p.File] = b
	return out, nil
}

// DeclaredFile is the file DeclareProviders writes. User files may not use the name.
const DeclaredFile = "kloud_required_providers.tf.json"

// DeclareProviders declares, as the build does, the providers kloud offers that the template uses
// but does not declare: it returns files with DeclaredFile added, which holds a required_providers
// entry (source) for each provider of offered with a source that the template uses
// (Config.Providers) without a required_providers entry of its own. Without the entry Terraform
// would look for hashicorp/<name>; ConfigureProvider adds the same when a provider builds the
// template, so a template that leaves required_providers out plans as it builds. An entry the
// user wrote with another source is an error (as at the build), and a provider the user declared
// is not declared again. The user's files are not changed (Terraform's messages keep their file
// and line numbers); with nothing to declare the result is files as they are.
func DeclareProviders(files map[string][]byte, offered []AllowedProvider) (map[string][]byte, error) {
	if _, taken := files[DeclaredFile]; taken {
		return nil, &ParseError{File: DeclaredFile, Summary: reservedName}
	}
	c, err := Parse(files)
	if err != nil {
		return nil, err
	}
	used := c.Providers()
	var ps []ProviderConfig
	for _, ap := range offered {
		if ap.Source != "" && slices.Contains(used, ap.Name) {
			ps = append(ps, ProviderConfig{Name: ap.Name, Source: ap.Source, File: DeclaredFile})
		}
	}
	declared := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if name == GeneratedFile || len(ps) == 0 {
			continue
		}
		_, blocks, err := providerBlocks(name, files[name])
		if err != nil {
			return nil, err
		}
		for _, blk := range blocks {
			if blk.Type != "terraform" {
				continue
			}
			for _, p := range ps {
				ok, err := p.required(blk)
				if err != nil {
					return nil, err
				}
				declared[p.Name] = declared[p.Name] || ok
			}
		}
	}
	out := maps.Clone(files)
	req := map[string]any{}
	for _, p := range ps {
		if !declared[p.Name] {
			req[p.Name] = p.requirement()
		}
	}
	if len(req) == 0 {
		return out, nil
	}
	b, err := MarshalJSON(map[string]any{
		"//":        "Generated by kloud: the providers kloud offers that the template uses without declaring them, as kloud declares them when it builds the template. Do not edit.",
		"terraform": map[string]any{"required_providers": req},
	})
	if err != nil {
		return nil, err
	}
	out[DeclaredFile] = b
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
		if !sameSource(src, p.Source) {
			return false, fmt.Errorf("%s: required_providers.%s must have source = %q (found %q); or leave it out and kloud declares it",
				a.Range, p.Name, p.Source, src)
		}
		found = true
	}
	return found, nil
}

// requirement is the provider's required_providers entry: its source, and its version if it has one.
func (p *ProviderConfig) requirement() map[string]string {
	r := map[string]string{"source": p.Source}
	if p.Version != "" {
		r["version"] = p.Version
	}
	return r
}

// sameSource reports whether a required_providers source is want ("kloud/kloudlocal"): Terraform
// reads source addresses case-insensitively, with the default registry host optional.
func sameSource(src, want string) bool {
	return strings.EqualFold(strings.TrimPrefix(strings.ToLower(src), "registry.terraform.io/"), want)
}

// providerBlocks parses a template file and returns it with its provider and terraform blocks.
func providerBlocks(name string, src []byte) (*hcl.File, hcl.Blocks, error) {
	var f *hcl.File
	var diags hcl.Diagnostics
	if strings.HasSuffix(name, ".tf.json") {
		f, diags = hcljson.Parse(src, name)
	} else {
		f, diags = hclsyntax.ParseConfig(src, name, hcl.InitialPos)
	}
	if diags.HasErrors() {
		return nil, nil, diags
	}
	content, _, diags := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "provider", LabelNames: []string{"name"}}, {Type: "terraform"},
	}})
	if diags.HasErrors() {
		return nil, nil, diags
	}
	return f, content.Blocks, nil
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
	return removeJSONEntry(src, "provider", p.Name)
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
