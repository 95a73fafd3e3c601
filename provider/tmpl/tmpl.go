package tmpl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
)

// GeneratedFile is the file DeclareVariable writes. User files may not use the name.
const GeneratedFile = "kloud_generated.tf.json"

// Config is a parsed stack template: the files of one root module.
type Config struct {
	files []*file // user files sorted by name, then the generated file if there is one
	gen   map[string]genVar

	// index, rebuilt after every change
	resources []*resource
	variables []Variable
}

type file struct {
	name string
	json bool
	src  []byte
	hcl  *hcl.File
}

type resource struct {
	Resource
	f     *file
	block *hcl.Block
}

// Resource is a managed resource ("resource" block) of the template.
type Resource struct {
	Type string
	Name string
	File string
	Line int
	// Count and ForEach report whether the resource has the count or for_each meta-argument.
	Count   bool
	ForEach bool
}

// Variable is a declared input variable.
type Variable struct {
	Name string
	// Type is the source text of the type constraint ("" when there is none).
	Type       string
	HasDefault bool
	// Sensitive reports sensitive = true (a literal).
	Sensitive bool
	File      string
	Line      int
}

// ParseError is a problem with a template file. Line and Column are 1-based; both are 0 when the
// problem is with the file as a whole (its name, say).
type ParseError struct {
	File    string
	Line    int
	Column  int
	Summary string
	Detail  string
}

func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	b.WriteString(": ")
	b.WriteString(e.Summary)
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// topSchema lists Terraform's top-level block types (Terraform 1.5 to 1.11).
var topSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "terraform"},
		{Type: "provider", LabelNames: []string{"name"}},
		{Type: "variable", LabelNames: []string{"name"}},
		{Type: "locals"},
		{Type: "output", LabelNames: []string{"name"}},
		{Type: "module", LabelNames: []string{"name"}},
		{Type: "resource", LabelNames: []string{"type", "name"}},
		{Type: "data", LabelNames: []string{"type", "name"}},
		{Type: "ephemeral", LabelNames: []string{"type", "name"}},
		{Type: "moved"},
		{Type: "import"},
		{Type: "removed"},
		{Type: "check", LabelNames: []string{"name"}},
		// kloud's own (params.go), taken out before Terraform sees the files
		{Type: ParameterBlock, LabelNames: []string{"name"}},
		{Type: PresetBlock, LabelNames: []string{"name"}},
	},
}

// Parse parses the files of a template: file name → content. Names must end in .tf (HCL native
// syntax) or .tf.json (HCL JSON syntax) and be plain names in one directory. Syntax errors are
// *ParseError values naming file:line:col.
func Parse(files map[string][]byte) (*Config, error) {
	if len(files) == 0 {
		return nil, errors.New("template has no files")
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)

	var errs []error
	folded := map[string]string{}
	for _, n := range names {
		if err := checkName(n); err != nil {
			errs = append(errs, err)
			continue
		}
		k := strings.ToLower(n)
		if prev, dup := folded[k]; dup {
			errs = append(errs, &ParseError{File: n, Summary: fmt.Sprintf("duplicate file name (also %q; names may differ only in case on some systems)", prev)})
			continue
		}
		folded[k] = n
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	c := &Config{gen: map[string]genVar{}}
	if i := slices.Index(names, GeneratedFile); i >= 0 {
		// Kloud's own output parsed again: the generated file goes last, as it did.
		names = append(slices.Delete(names, i, i+1), GeneratedFile)
	}
	for _, n := range names {
		src := bytes.Clone(files[n])
		if err := checkUTF8(n, src); err != nil {
			errs = append(errs, err)
			continue
		}
		if n == GeneratedFile {
			if err := c.loadGenerated(src); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		f := &file{name: n, json: strings.HasSuffix(n, ".tf.json"), src: src}
		if diags := f.parse(); diags.HasErrors() {
			errs = append(errs, diagErrors(diags)...)
			continue
		}
		c.files = append(c.files, f)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := c.reindex(); err != nil {
		return nil, err
	}
	return c, nil
}

// reservedName refuses a user file named DeclaredFile.
const reservedName = "the name is reserved for the file in which kloud declares the providers a template uses; rename the file"

func checkName(n string) error {
	bad := func(why string) error { return &ParseError{File: n, Summary: why} }
	switch {
	case n == "":
		return bad("empty file name")
	case strings.ContainsAny(n, `/\`):
		return bad("subdirectories are not supported: a template is the files of one directory")
	case !strings.HasSuffix(n, ".tf") && !strings.HasSuffix(n, ".tf.json"):
		return bad("not a Terraform file: the name must end in .tf or .tf.json")
	case strings.HasPrefix(n, ".") || strings.HasSuffix(n, "~") || strings.HasPrefix(n, "#"):
		return bad("terraform ignores files whose names start with '.' or '#' or end in '~'")
	}
	if n == DeclaredFile {
		return bad(reservedName)
	}
	base := strings.TrimSuffix(strings.TrimSuffix(n, ".json"), ".tf")
	if base == "override" || strings.HasSuffix(base, "_override") {
		return bad("override files are not supported: they would change resources after kloud rewrote them")
	}
	return nil
}

// loadGenerated reads back a GeneratedFile. It may hold only what DeclareVariable writes, since
// the next DeclareVariable rewrites it.
func (c *Config) loadGenerated(src []byte) error {
	var g struct {
		Comment  string            `json:"//"`
		Variable map[string]genVar `json:"variable"`
	}
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return &ParseError{File: GeneratedFile, Summary: "the name is reserved for the file kloud generates, which holds only variable declarations", Detail: err.Error()}
	}
	maps.Copy(c.gen, g.Variable)
	return nil
}

func checkUTF8(name string, src []byte) error {
	if utf8.Valid(src) {
		return nil
	}
	line, col := 1, 1
	for i := 0; i < len(src); {
		r, size := utf8.DecodeRune(src[i:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		if r == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
		i += size
	}
	return &ParseError{File: name, Line: line, Column: col, Summary: "file is not valid UTF-8"}
}

func (f *file) parse() hcl.Diagnostics {
	var diags hcl.Diagnostics
	if f.json {
		f.hcl, diags = hcljson.Parse(f.src, f.name)
	} else {
		f.hcl, diags = hclsyntax.ParseConfig(f.src, f.name, hcl.InitialPos)
	}
	if diags.HasErrors() {
		return diags
	}
	_, _, d := f.hcl.Body.PartialContent(topSchema)
	return d
}

func diagErrors(diags hcl.Diagnostics) []error {
	var errs []error
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		e := &ParseError{Summary: d.Summary, Detail: d.Detail}
		if d.Subject != nil {
			e.File, e.Line, e.Column = d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column
		}
		errs = append(errs, e)
	}
	return errs
}

// blocks returns the file's top-level blocks and the body left over.
func (f *file) blocks() (hcl.Blocks, hcl.Body) {
	content, rest, _ := f.hcl.Body.PartialContent(topSchema)
	return content.Blocks, rest
}

// reindex rebuilds the resource and variable index and checks declarations are unique.
func (c *Config) reindex() error {
	c.resources, c.variables = nil, nil
	seen := map[string]hcl.Range{}
	var errs []error
	dup := func(kind, key string, r hcl.Range) {
		if prev, ok := seen[kind+" "+key]; ok {
			errs = append(errs, &ParseError{File: r.Filename, Line: r.Start.Line, Column: r.Start.Column,
				Summary: fmt.Sprintf("duplicate %s %s", kind, key),
				Detail:  fmt.Sprintf("already declared at %s", posString(prev))})
			return
		}
		seen[kind+" "+key] = r
	}
	for _, f := range c.files {
		blocks, _ := f.blocks()
		for _, b := range blocks {
			switch b.Type {
			case "resource":
				r := &resource{f: f, block: b, Resource: Resource{Type: b.Labels[0], Name: b.Labels[1], File: f.name, Line: blockLine(b)}}
				attrs := attributes(b.Body)
				_, r.Count = attrs["count"]
				_, r.ForEach = attrs["for_each"]
				dup("resource", fmt.Sprintf("%q %q", r.Type, r.Name), blockRange(b))
				c.resources = append(c.resources, r)
			case "data":
				dup("data", fmt.Sprintf("%q %q", b.Labels[0], b.Labels[1]), blockRange(b))
			case "variable":
				v := Variable{Name: b.Labels[0], File: f.name, Line: blockLine(b)}
				attrs := attributes(b.Body)
				_, v.HasDefault = attrs["default"]
				if a := attrs["sensitive"]; a != nil {
					s, ok := literal(f, a.Expr)
					v.Sensitive = ok && s == true
				}
				if a := attrs["type"]; a != nil {
					v.Type = exprSource(f, a.Expr)
				}
				dup("variable", fmt.Sprintf("%q", v.Name), blockRange(b))
				c.variables = append(c.variables, v)
			}
		}
	}
	return errors.Join(errs...)
}

func posString(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}

// blockRange is where a block starts: its type keyword in HCL; in JSON, where the type can be
// lines away, the key of its last label (or the type key for blocks without labels).
func blockRange(b *hcl.Block) hcl.Range {
	if _, native := b.Body.(*hclsyntax.Body); !native && len(b.LabelRanges) > 0 {
		return b.LabelRanges[len(b.LabelRanges)-1]
	}
	return b.TypeRange
}

func blockLine(b *hcl.Block) int { return blockRange(b).Start.Line }

// attributes returns a block body's attributes: the arguments in HCL; every property (nested
// blocks included, as object-valued attributes) in JSON.
func attributes(body hcl.Body) hcl.Attributes {
	if sb, ok := body.(*hclsyntax.Body); ok {
		out := make(hcl.Attributes, len(sb.Attributes))
		for n, a := range sb.Attributes {
			out[n] = a.AsHCLAttribute()
		}
		return out
	}
	attrs, _ := body.JustAttributes()
	return attrs
}

func exprSource(f *file, e hcl.Expression) string {
	r := e.Range()
	s := string(f.src[r.Start.Byte:r.End.Byte])
	if f.json {
		if v, ok := jsonString(s); ok {
			return v
		}
	}
	return s
}

// Resources returns the managed resources of type typ (all of them for ""), in file order: files
// sorted by name, blocks in source order.
func (c *Config) Resources(typ string) []Resource {
	var out []Resource
	for _, r := range c.resources {
		if typ == "" || r.Type == typ {
			out = append(out, r.Resource)
		}
	}
	return out
}

func (c *Config) resource(typ, name string) (*resource, error) {
	for _, r := range c.resources {
		if r.Type == typ && r.Name == name {
			return r, nil
		}
	}
	return nil, fmt.Errorf("resource %q %q not found in the template", typ, name)
}

// Variables returns the declared variables, those of GeneratedFile included, in file order.
func (c *Config) Variables() []Variable { return slices.Clone(c.variables) }

func (c *Config) variable(name string) (Variable, bool) {
	for _, v := range c.variables {
		if v.Name == name {
			return v, true
		}
	}
	return Variable{}, false
}

// Providers returns the local names of the providers the template uses, sorted: provider
// blocks, terraform.required_providers entries, the provider meta-argument of resources and data
// sources, and the prefixes of resource and data source types ("aws" for "aws_instance"; this
// includes "terraform" for the built-in terraform_data).
func (c *Config) Providers() []string {
	set := map[string]bool{}
	add := func(s string) {
		if s != "" {
			set[s] = true
		}
	}
	for _, f := range c.files {
		blocks, _ := f.blocks()
		for _, b := range blocks {
			switch b.Type {
			case "provider":
				add(b.Labels[0])
			case "terraform":
				content, _, _ := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "required_providers"}}})
				for _, rp := range content.Blocks {
					for n := range attributes(rp.Body) {
						add(n)
					}
				}
			case "resource", "data", "ephemeral":
				typ, _, _ := strings.Cut(b.Labels[0], "_")
				add(typ)
				if a := attributes(b.Body)["provider"]; a != nil {
					if t, diags := hcl.AbsTraversalForExpr(a.Expr); !diags.HasErrors() {
						add(t.RootName())
					}
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Files returns the template's files as they are now (rewritten, and with GeneratedFile when a
// variable was declared). The map and slices are copies.
// Holds reports whether c is files parsed: the same names with the same contents. A caller that
// keeps a Config next to the files it came from uses it to tell whether someone changed the
// files since (then they are parsed again).
func (c *Config) Holds(files map[string][]byte) bool {
	if c == nil || len(c.files) != len(files) {
		return false
	}
	for _, f := range c.files {
		src, ok := files[f.name]
		if !ok || !bytes.Equal(src, f.src) {
			return false
		}
	}
	return true
}

func (c *Config) Files() map[string][]byte {
	out := make(map[string][]byte, len(c.files))
	for _, f := range c.files {
		out[f.name] = bytes.Clone(f.src)
	}
	return out
}

func (c *Config) fileByName(name string) *file {
	for _, f := range c.files {
		if f.name == name {
			return f
		}
	}
	return nil
}
