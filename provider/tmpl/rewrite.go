package tmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// SetUserData rewrites attribute attr of resource typ.name to var.<varName>[count.index] when the
// resource has count, and to var.<varName> otherwise, adding the attribute (or the key, for
// "attr.key") when it is absent. Declare the variable with DeclareVariable: list(string) with
// count, string without.
//
// Only the bytes of the old expression change (or the new attribute is inserted); comments,
// formatting and everything else in the file stay as they were.
func (c *Config) SetUserData(typ, name, attr, varName string) error {
	r, err := c.resource(typ, name)
	if err != nil {
		return err
	}
	p, err := parseAttrPath(attr)
	if err != nil {
		return err
	}
	if !hclsyntax.ValidIdentifier(varName) {
		return fmt.Errorf("variable name %q is not a valid identifier", varName)
	}
	ref := "var." + varName
	if r.Count {
		ref += "[count.index]"
	}
	f := r.f
	edit, err := userDataEdit(f, r.block, p, ref)
	if err != nil {
		return fmt.Errorf("resource %q %q: %w", typ, name, err)
	}
	old := f.src
	f.src = edit.apply(f.src)
	if diags := f.parse(); diags.HasErrors() {
		// A bug here, not in the user's template: put the file back.
		bad := f.src
		f.src = old
		f.parse()
		return fmt.Errorf("rewriting %s %s of resource %q %q produced invalid syntax: %w\n%s", f.name, p, typ, name, diags, bad)
	}
	return c.reindex()
}

// edit replaces src[start:end] with text.
type edit struct {
	start, end int
	text       string
}

func (e edit) apply(src []byte) []byte {
	out := make([]byte, 0, len(src)+len(e.text))
	out = append(out, src[:e.start]...)
	out = append(out, e.text...)
	return append(out, src[e.end:]...)
}

func userDataEdit(f *file, b *hcl.Block, p attrPath, ref string) (edit, error) {
	value := ref // HCL expression
	if f.json {
		value = jsonQuote("${" + ref + "}")
	}
	a, item, isObject := lookupAttr(b.Body, p)
	switch {
	case a != nil && p.key == "":
		r := a.Expr.Range()
		return edit{r.Start.Byte, r.End.Byte, value}, nil
	case a != nil && item != nil:
		r := item.Value.Range()
		return edit{r.Start.Byte, r.End.Byte, value}, nil
	case a != nil && !isObject:
		return edit{}, fmt.Errorf("cannot set %s: %s is not an object constructor ({ ... })", p, p.attr)
	case a != nil: // an object without the key
		open := a.Expr.Range().Start.Byte
		if f.src[open] != '{' {
			return edit{}, fmt.Errorf("cannot set %s: %s is not an object constructor ({ ... })", p, p.attr)
		}
		if f.json {
			return jsonInsert(f.src, open, jsonQuote(p.key), value), nil
		}
		return hclObjectInsert(f.src, open, hclKey(p.key), value), nil
	}
	// The attribute is absent.
	if f.json {
		v := value
		if p.key != "" {
			v = "{" + jsonQuote(p.key) + ": " + value + "}"
		}
		open := jsonBodyOpen(f.src, b)
		if open < 0 {
			return edit{}, fmt.Errorf("body of the block not found in %s", f.name)
		}
		return jsonInsert(f.src, open, jsonQuote(p.attr), v), nil
	}
	v := value
	if p.key != "" {
		v = "{ " + hclKey(p.key) + " = " + value + " }"
	}
	sb, ok := b.Body.(*hclsyntax.Body)
	if !ok {
		return edit{}, fmt.Errorf("unexpected body type %T", b.Body)
	}
	blk := nativeBlock(f, b)
	if blk == nil {
		return edit{}, fmt.Errorf("block not found in %s", f.name)
	}
	return hclBlockInsert(f.src, blk, sb, p.attr+" = "+v), nil
}

// nativeBlock finds the hclsyntax block behind b (whose OpenBraceRange and CloseBraceRange the
// generic hcl.Block lacks).
func nativeBlock(f *file, b *hcl.Block) *hclsyntax.Block {
	for _, blk := range f.hcl.Body.(*hclsyntax.Body).Blocks {
		if blk.TypeRange == b.TypeRange {
			return blk
		}
	}
	return nil
}

// jsonBodyOpen returns the offset of the opening brace of a JSON block's body. DefRange is that
// brace, except for a block given as an array of bodies ("web": [{...}]), where it is the
// array's bracket; then the body is the element ending at the body's closing brace.
func jsonBodyOpen(src []byte, b *hcl.Block) int {
	open := b.DefRange.Start.Byte
	if src[open] == '{' {
		return open
	}
	end := b.Body.MissingItemRange().Start.Byte + 1 // just past the body's '}'
	dec := json.NewDecoder(bytes.NewReader(src[open:]))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return -1
	}
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return -1
		}
		if e := open + int(dec.InputOffset()); e == end {
			return e - len(raw)
		}
	}
	return -1
}

func jsonQuote(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(buf.String(), "\n")
}

// hclKey is an object key: the bare name when it is an identifier, else a quoted string.
func hclKey(k string) string {
	if hclsyntax.ValidIdentifier(k) {
		return k
	}
	q := jsonQuote(k)
	q = strings.ReplaceAll(q, "${", "$${")
	return strings.ReplaceAll(q, "%{", "%%{")
}

// lineIndent returns the whitespace that starts the line holding src[pos].
func lineIndent(src []byte, pos int) string {
	start := bytes.LastIndexByte(src[:pos], '\n') + 1
	end := start
	for end < len(src) && (src[end] == ' ' || src[end] == '\t') {
		end++
	}
	return string(src[start:end])
}

// afterOpen looks at what follows the opening brace at src[open]: whether the rest of its line is
// blank (whitespace, then a newline) and the first non-blank byte after it.
func afterOpen(src []byte, open int) (lineBreak bool, next int) {
	i := open + 1
	for i < len(src) && (src[i] == ' ' || src[i] == '\t' || src[i] == '\r') {
		i++
	}
	lineBreak = i < len(src) && src[i] == '\n'
	for i < len(src) && (src[i] == ' ' || src[i] == '\t' || src[i] == '\r' || src[i] == '\n') {
		i++
	}
	return lineBreak, i
}

// jsonInsert adds "key": value as the first property of the object opening at src[open].
func jsonInsert(src []byte, open int, key, value string) edit {
	prop := key + ": " + value
	lineBreak, next := afterOpen(src, open)
	empty := next < len(src) && src[next] == '}'
	switch {
	case empty && lineBreak:
		// {\n<indent>} → {\n<indent>  "k": v\n<indent>}
		ind := lineIndent(src, next)
		return edit{open + 1, next, "\n" + ind + "  " + prop + "\n" + ind}
	case empty:
		return edit{open + 1, next, prop}
	case lineBreak:
		return edit{open + 1, open + 1, "\n" + lineIndent(src, next) + prop + ","}
	case src[open+1] == ' ':
		return edit{open + 1, open + 1, " " + prop + ","}
	default:
		return edit{open + 1, open + 1, prop + ", "}
	}
}

// hclObjectInsert adds key = value as the first item of the object constructor opening at
// src[open].
func hclObjectInsert(src []byte, open int, key, value string) edit {
	item := key + " = " + value
	lineBreak, next := afterOpen(src, open)
	empty := next < len(src) && src[next] == '}'
	switch {
	case empty && lineBreak:
		ind := lineIndent(src, next)
		return edit{open + 1, next, "\n" + ind + "  " + item + "\n" + ind}
	case empty:
		return edit{open + 1, next, " " + item + " "}
	case lineBreak:
		// Items on their own lines need no comma.
		return edit{open + 1, open + 1, "\n" + lineIndent(src, next) + item}
	case src[open+1] == ' ':
		return edit{open + 1, open + 1, " " + item + ","}
	default:
		return edit{open + 1, open + 1, item + ", "}
	}
}

// hclBlockInsert adds the attribute line to a block body: before the closing brace of a
// multi-line block, or by opening up a block written on one line ({} or { a = 1 }).
func hclBlockInsert(src []byte, blk *hclsyntax.Block, body *hclsyntax.Body, line string) edit {
	open, close := blk.OpenBraceRange.Start.Byte, blk.CloseBraceRange.Start.Byte
	outer := lineIndent(src, blk.TypeRange.Start.Byte)
	inner := outer + "  "
	first := -1
	for _, a := range body.Attributes {
		if s := a.SrcRange.Start.Byte; first < 0 || s < first {
			first = s
		}
	}
	for _, nb := range body.Blocks {
		if s := nb.TypeRange.Start.Byte; first < 0 || s < first {
			first = s
		}
	}
	if blk.OpenBraceRange.Start.Line == blk.CloseBraceRange.Start.Line {
		text := "{\n"
		if content := strings.TrimSpace(string(src[open+1 : close])); content != "" {
			text += inner + content + "\n"
		}
		return edit{open, close + 1, text + inner + line + "\n" + outer + "}"}
	}
	if first >= 0 && blk.OpenBraceRange.Start.Line != lineOf(src, first) {
		inner = lineIndent(src, first)
	}
	// In a valid multi-line block the closing brace starts its line (after indentation).
	lineStart := bytes.LastIndexByte(src[:close], '\n') + 1
	return edit{lineStart, lineStart, inner + line + "\n"}
}

func lineOf(src []byte, pos int) int { return bytes.Count(src[:pos], []byte{'\n'}) + 1 }

type genVar struct {
	Type      string `json:"type,omitempty"`
	Sensitive bool   `json:"sensitive,omitempty"`
}

// reservedVarNames are names Terraform does not allow for variables.
var reservedVarNames = map[string]bool{
	"source": true, "version": true, "providers": true, "count": true, "for_each": true,
	"lifecycle": true, "depends_on": true, "locals": true,
}

// DeclareVariable declares variable name, without a default, in GeneratedFile. typeExpr is a
// Terraform type constraint ("string", "list(string)"; "" for any type); sensitive marks the
// variable sensitive, so Terraform hides its value in plans and logs. Declaring a name again
// replaces the declaration.
//
// A variable the user's files already declare is left to them, when it is compatible: when
// sensitive is asked for, the user's declaration must have sensitive = true. Otherwise
// DeclareVariable returns an error naming the user's declaration.
func (c *Config) DeclareVariable(name, typeExpr string, sensitive bool) error {
	if !hclsyntax.ValidIdentifier(name) || reservedVarNames[name] {
		return fmt.Errorf("variable name %q is not a valid identifier or is reserved", name)
	}
	if typeExpr != "" {
		e, diags := hclsyntax.ParseExpression([]byte(typeExpr), "type", hcl.InitialPos)
		if !diags.HasErrors() {
			_, _, diags = typeexpr.TypeConstraintWithDefaults(e)
		}
		if diags.HasErrors() {
			return fmt.Errorf("variable %q: type %q: %w", name, typeExpr, diags)
		}
	}
	if v, ok := c.variable(name); ok && v.File != GeneratedFile {
		if sensitive && !v.Sensitive {
			return fmt.Errorf("variable %q is declared at %s:%d without sensitive = true; kloud passes a secret in it: mark it sensitive or remove the declaration (kloud declares it)", name, v.File, v.Line)
		}
		return nil
	}
	c.gen[name] = genVar{Type: typeExpr, Sensitive: sensitive}
	return c.writeGenerated()
}

func (c *Config) writeGenerated() error {
	names := make([]string, 0, len(c.gen))
	for n := range c.gen {
		names = append(names, n)
	}
	sort.Strings(names)
	// One variable per line, in name order, so the generated file diffs well.
	var b strings.Builder
	b.WriteString("{\n  \"//\": \"Generated by kloud. Do not edit.\",\n  \"variable\": {")
	for i, n := range names {
		v, _ := json.Marshal(c.gen[n])
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "\n    %s: %s", jsonQuote(n), v)
	}
	b.WriteString("\n  }\n}\n")

	f := c.fileByName(GeneratedFile)
	if f == nil {
		f = &file{name: GeneratedFile, json: true}
		c.files = append(c.files, f)
	}
	f.src = []byte(b.String())
	if diags := f.parse(); diags.HasErrors() {
		return fmt.Errorf("generated file: %w", diags)
	}
	return c.reindex()
}
