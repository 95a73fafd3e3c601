package tmpl

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// SecretRefError is a reference to a secret variable outside a provider block.
type SecretRefError struct {
	File   string
	Line   int
	Column int
	// Var is the variable's name.
	Var string
	// Block is the top-level block, e.g. `resource "aws_instance" "web"` or `locals`.
	Block string
	// Path leads from Block to the attribute: nested blocks, then the attribute name, e.g.
	// `provisioner "local-exec" > command`. In JSON files nested blocks read as attributes.
	Path string
}

func (e *SecretRefError) Error() string {
	where := e.Block
	if e.Path != "" {
		where += " > " + e.Path
	}
	return fmt.Sprintf("%s:%d:%d: var.%s is a secret that only provider blocks may use; it is used in %s",
		e.File, e.Line, e.Column, e.Var, where)
}

// CheckSecretRefs returns an error for each reference to one of the secretVars outside a
// provider block: in resources, data sources, locals, outputs, module arguments, variable
// defaults, provisioners and connections, dynamic blocks, count and for_each, function arguments,
// anywhere. Each is a *SecretRefError; several are joined with errors.Join, in file order.
//
// References are found with HCL's own analysis (Expression.Variables) in both syntaxes, so an
// escaped "$${var.x}" is not a reference and a for-expression iterator named like a variable is
// not mistaken for one. This check is what keeps credentials that kloud passes as variables out
// of resource attributes, user data, state outputs and plan output. Secrets still reach whatever
// a provider block passes them to; see the package doc.
func (c *Config) CheckSecretRefs(secretVars []string) error {
	secret := map[string]bool{}
	for _, v := range secretVars {
		secret[v] = true
	}
	if len(secret) == 0 {
		return nil
	}
	var errs []*SecretRefError
	check := func(e hcl.Expression, block, path string) {
		for _, t := range e.Variables() {
			if name, ok := varName(t); ok && secret[name] {
				r := t.SourceRange()
				errs = append(errs, &SecretRefError{File: r.Filename, Line: r.Start.Line, Column: r.Start.Column,
					Var: name, Block: block, Path: path})
			}
		}
	}
	for _, f := range c.files {
		if sb, ok := f.hcl.Body.(*hclsyntax.Body); ok {
			for _, a := range sb.Attributes {
				check(a.Expr, "top level", a.Name)
			}
			for _, b := range sb.Blocks {
				if b.Type == "provider" {
					continue
				}
				walkNative(b.Body, blockDesc(b.Type, b.Labels), nil, check)
			}
			continue
		}
		blocks, rest := f.blocks()
		for _, b := range blocks {
			if b.Type == "provider" {
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
	sort.SliceStable(errs, func(i, j int) bool {
		a, b := errs[i], errs[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return errors.Join(out...)
}

func walkNative(body *hclsyntax.Body, block string, path []string, check func(hcl.Expression, string, string)) {
	for _, a := range body.Attributes {
		check(a.Expr, block, strings.Join(append(path, a.Name), " > "))
	}
	for _, b := range body.Blocks {
		walkNative(b.Body, block, append(path[:len(path):len(path)], blockDesc(b.Type, b.Labels)), check)
	}
}

func blockDesc(typ string, labels []string) string {
	var b strings.Builder
	b.WriteString(typ)
	for _, l := range labels {
		fmt.Fprintf(&b, " %q", l)
	}
	return b.String()
}

// varName returns the variable a traversal refers to: var.name, or var["name"].
func varName(t hcl.Traversal) (string, bool) {
	if len(t) < 2 || t.RootName() != "var" {
		return "", false
	}
	switch s := t[1].(type) {
	case hcl.TraverseAttr:
		return s.Name, true
	case hcl.TraverseIndex:
		if s.Key.Type() == cty.String && s.Key.IsKnown() && !s.Key.IsNull() {
			return s.Key.AsString(), true
		}
	}
	return "", false
}
