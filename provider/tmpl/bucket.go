package tmpl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// Bucket claims: a template declares an object bucket as a resource kloud handles itself,
//
//	resource "kloud_bucket" "cache" {
//	  retain      = false # destroying the stack deletes the bucket and its data (true: keeps them)
//	  max_size_mb = 1024  # optional
//	  provider    = "local" # optional: which provider provisions it
//	}
//
// Buckets reads and checks these blocks and RemoveBuckets takes them out of the files Terraform
// sees (docs/buckets.md "Claims").

// BucketType is the resource type of a bucket claim.
const BucketType = "kloud_bucket"

// MaxBuckets is the most bucket claims one template may declare.
const MaxBuckets = 8

// BucketDecl is a kloud_bucket block of the template.
type BucketDecl struct {
	// Label is the block's name ("cache").
	Label string
	// Retain: destroying the stack keeps the bucket and its data.
	Retain bool
	// MaxSizeMB, when > 0, is the most the bucket may hold, in MiB.
	MaxSizeMB int64
	// Provider is the provider that provisions the bucket, "" when the block does not say.
	Provider string
	File     string
	Line     int
}

// Buckets returns the template's kloud_bucket blocks, in file order, checked: the label's
// characters and length, only literal retain (bool), max_size_mb (a positive whole number) and
// provider (a string), no nested blocks, at most MaxBuckets, and no reference to kloud_bucket.*
// anywhere else in the template (machines find their buckets in their environment). Every
// problem names file:line; several are joined.
func (c *Config) Buckets() ([]BucketDecl, error) {
	var out []BucketDecl
	var errs []error
	bad := func(file string, line int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...)))
	}
	for _, r := range c.resources {
		if r.Type != BucketType {
			continue
		}
		d := BucketDecl{Label: r.Name, File: r.File, Line: r.Line}
		where := fmt.Sprintf("resource %q %q", BucketType, r.Name)
		if ptype.ValidBucketLabel(r.Name) != nil {
			bad(r.File, r.Line, "%s: a bucket's name is 1 to %d lower-case letters, digits and '-', beginning with a letter and not ending with '-'", where, ptype.BucketLabelMax)
		}
		if sb, ok := r.block.Body.(*hclsyntax.Body); ok {
			for _, b := range sb.Blocks {
				bad(r.File, b.TypeRange.Start.Line, "%s: block %q: a bucket takes only retain, max_size_mb and provider", where, b.Type)
			}
		}
		attrs := attributes(r.block.Body)
		for _, n := range slices.Sorted(maps.Keys(attrs)) {
			a := attrs[n]
			line := a.NameRange.Start.Line
			v, lit := literal(r.f, a.Expr)
			switch n {
			case "retain":
				b, ok := v.(bool)
				if !lit || !ok {
					bad(r.File, line, "%s: retain must be true or false, written as a literal", where)
				}
				d.Retain = b
			case "max_size_mb":
				i, ok := v.(int64)
				if !lit || !ok || i <= 0 || i > math.MaxInt64>>20 {
					bad(r.File, line, "%s: max_size_mb must be a positive whole number of MiB, written as a literal", where)
				}
				d.MaxSizeMB = i
			case "provider":
				s, ok := v.(string)
				if !lit || !ok || s == "" {
					bad(r.File, line, `%s: provider must be a provider's name in quotes ("local")`, where)
				}
				d.Provider = s
			default:
				bad(r.File, line, "%s: argument %q: a bucket takes only retain, max_size_mb and provider", where, n)
			}
		}
		out = append(out, d)
	}
	if len(out) > MaxBuckets {
		bad(out[MaxBuckets].File, out[MaxBuckets].Line, "a template declares at most %d buckets (this is bucket %d)", MaxBuckets, MaxBuckets+1)
	}
	errs = append(errs, c.bucketRefs()...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// bucketRefs finds references to kloud_bucket.* outside the bucket blocks.
func (c *Config) bucketRefs() []error {
	var errs []error
	check := func(e hcl.Expression, block, path string) {
		for _, t := range e.Variables() {
			if t.RootName() != BucketType {
				continue
			}
			r := t.SourceRange()
			errs = append(errs, fmt.Errorf("%s:%d: %s: %s refers to a kloud_bucket; machines find their buckets in their environment and in ~/.config/kloud/buckets/ (docs/buckets.md), not through the template",
				r.Filename, r.Start.Line, block, path))
		}
	}
	isBucket := func(b *hcl.Block) bool { return b.Type == "resource" && len(b.Labels) > 0 && b.Labels[0] == BucketType }
	for _, f := range c.files {
		if sb, ok := f.hcl.Body.(*hclsyntax.Body); ok {
			for _, a := range sb.Attributes {
				check(a.Expr, "top level", a.Name)
			}
			for _, b := range sb.Blocks {
				if !isBucket(b.AsHCLBlock()) {
					walkNative(b.Body, blockDesc(b.Type, b.Labels), nil, check)
				}
			}
			continue
		}
		blocks, rest := f.blocks()
		for _, b := range blocks {
			if isBucket(b) {
				continue
			}
			for _, a := range attributes(b.Body) {
				check(a.Expr, blockDesc(b.Type, b.Labels), a.Name)
			}
		}
		for _, a := range attributes(rest) {
			check(a.Expr, "top level", a.Name)
		}
	}
	return errs
}

// RemoveBuckets takes every kloud_bucket block out of the files: Terraform never sees them.
// In HCL files a block becomes a comment of as many lines, so Terraform's messages still point at
// the right lines; in JSON files resource.kloud_bucket is removed and the file re-encoded.
func (c *Config) RemoveBuckets() error {
	for _, f := range c.files {
		var blocks []*hcl.Block
		for _, r := range c.resources {
			if r.f == f && r.Type == BucketType {
				blocks = append(blocks, r.block)
			}
		}
		if len(blocks) == 0 {
			continue
		}
		old := f.src
		var err error
		if f.json {
			f.src, err = removeJSONEntry(f.src, "resource", BucketType)
		} else {
			f.src, err = removeHCLBlocks(f, blocks, "# kloud_bucket: provisioned by kloud, not Terraform")
		}
		if err != nil {
			return fmt.Errorf("%s: remove kloud_bucket blocks: %w", f.name, err)
		}
		if diags := f.parse(); diags.HasErrors() {
			bad := f.src
			f.src = old
			f.parse()
			return fmt.Errorf("removing kloud_bucket blocks from %s produced invalid syntax: %w\n%s", f.name, diags, bad)
		}
	}
	return c.reindex()
}

// removeHCLBlocks replaces blocks of native file f with comments (comment, then as many lines).
func removeHCLBlocks(f *file, blocks []*hcl.Block, comment string) ([]byte, error) {
	body, ok := f.hcl.Body.(*hclsyntax.Body)
	if !ok {
		return nil, fmt.Errorf("unexpected body type %T", f.hcl.Body)
	}
	var ranges []hcl.Range
	for _, sb := range body.Blocks {
		for _, b := range blocks {
			if sb.DefRange() == b.DefRange {
				ranges = append(ranges, sb.Range())
			}
		}
	}
	if len(ranges) != len(blocks) {
		return nil, fmt.Errorf("found %d of %d blocks", len(ranges), len(blocks))
	}
	sort.Slice(ranges, func(i, j int) bool { return ranges[i].Start.Byte > ranges[j].Start.Byte })
	out := bytes.Clone(f.src)
	for _, r := range ranges {
		n := bytes.Count(out[r.Start.Byte:r.End.Byte], []byte{'\n'})
		text := comment + strings.Repeat("\n", n)
		out = edit{start: r.Start.Byte, end: r.End.Byte, text: text}.apply(out)
	}
	return out, nil
}

// removeJSONEntry deletes <top>.<key> from a .tf.json file (the object or the array form of
// top: "provider", "resource"), and top itself when nothing is left in it. The file is
// re-encoded; every other value keeps its bytes' meaning.
func removeJSONEntry(src []byte, topKey, key string) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(src, &top); err != nil {
		return nil, err
	}
	raw := bytes.TrimSpace(top[topKey])
	drop := func(obj json.RawMessage) (map[string]json.RawMessage, error) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(obj, &m); err != nil {
			return nil, err
		}
		delete(m, key)
		return m, nil
	}
	var kept any
	if len(raw) > 0 && raw[0] == '[' {
		var arr []json.RawMessage
		if err := json.Unmarshal(raw, &arr); err != nil {
			return nil, err
		}
		var ms []map[string]json.RawMessage
		for _, el := range arr {
			m, err := drop(el)
			if err != nil {
				return nil, err
			}
			if len(m) > 0 {
				ms = append(ms, m)
			}
		}
		if len(ms) > 0 {
			kept = ms
		}
	} else if len(raw) > 0 {
		m, err := drop(raw)
		if err != nil {
			return nil, err
		}
		if len(m) > 0 {
			kept = m
		}
	}
	if kept == nil {
		delete(top, topKey)
	} else {
		b, err := json.Marshal(kept)
		if err != nil {
			return nil, err
		}
		top[topKey] = b
	}
	return MarshalJSON(top)
}
