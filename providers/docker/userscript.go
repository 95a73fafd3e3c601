package docker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// UserDataLabel is how a template gives its docker machines their own user data (a script or a
// #cloud-config, merged with kloud's as on every provider: userdata.Render), since
// docker_container has no user_data argument:
//
//	resource "docker_container" "dev" {
//	  ...
//	  labels {
//	    label = "kloud_user_data"
//	    value = <<-EOT
//	      #!/bin/sh
//	      apt-get install -y git
//	    EOT
//	  }
//	}
//
// It is the only labels block a template may write (kloud sets the container's labels itself).
// ApplyTemplate reads its value (the literal, else the planned value, so expressions such as
// count.index work), renders it into the machine's NoCloud seed and removes the block: the
// label never reaches the container, so the Docker API proxy's allowlist is unchanged and the
// script is readable only by root in the machine (the seed is 0600), not by `docker inspect`.
const UserDataLabel = "kloud_user_data"

// userDataBlocks returns, for a docker_container body, the source ranges of its labels blocks
// (or JSON labels property) that carry UserDataLabel, as bodyArgs reports them; an error names a
// labels block with any other label, or more than one user data label.
func userDataBlocks(body hcl.Body, res string) (map[hcl.Range]bool, error) {
	ok := map[hcl.Range]bool{}
	n := 0
	var last hcl.Range
	refuse := func(r hcl.Range) error {
		return labelsFinding(r, res, fmt.Sprintf("kloud sets the container's labels itself; the only labels block a template may write is one with label = %q, the machine's own user data (a script or #cloud-config)", UserDataLabel))
	}
	if sb, native := body.(*hclsyntax.Body); native {
		for _, nb := range sb.Blocks {
			if nb.Type != "labels" {
				continue
			}
			a := nb.Body.Attributes["label"]
			if a == nil {
				return nil, refuse(nb.TypeRange)
			}
			v, diags := a.Expr.Value(nil)
			if diags.HasErrors() || v.Type() != cty.String || v.IsNull() || v.AsString() != UserDataLabel {
				return nil, refuse(nb.TypeRange)
			}
			ok[nb.TypeRange] = true
			last = nb.TypeRange
			n++
		}
	} else {
		attrs, _ := body.JustAttributes()
		if a := attrs["labels"]; a != nil {
			v, diags := a.Expr.Value(nil) // JSON: strings stay literal
			if diags.HasErrors() {
				return nil, refuse(a.NameRange)
			}
			for _, el := range jsonElems(v) {
				if !el.Type().IsObjectType() || !el.Type().HasAttribute("label") {
					return nil, refuse(a.NameRange)
				}
				if l := el.GetAttr("label"); l.Type() != cty.String || l.IsNull() || l.AsString() != UserDataLabel {
					return nil, refuse(a.NameRange)
				}
				n++
			}
			ok[a.NameRange] = true
			last = a.NameRange
		}
	}
	if n > 1 {
		return nil, labelsFinding(last, res, fmt.Sprintf("%d labels blocks with label %q: write one (the machine's own user data)", n, UserDataLabel))
	}
	return ok, nil
}

// labelsFinding refuses a labels block of resource docker_container.res at r.
func labelsFinding(r hcl.Range, res, detail string) provider.TemplateFinding {
	return provider.TemplateFinding{File: r.Filename, Line: r.Start.Line, Construct: ResourceType + "." + res + ": labels", Rule: RuleArgument, Detail: detail}
}

// jsonElems is a JSON labels value as a list: an object is one block, an array (tuple) many.
func jsonElems(v cty.Value) []cty.Value {
	if v.IsNull() || !v.IsKnown() {
		return nil
	}
	if t := v.Type(); t.IsTupleType() || t.IsListType() {
		return v.AsValueSlice()
	}
	return []cty.Value{v}
}

// literalUserData returns the value of resource res's user data label when it is a literal
// (no references, no interpolation): ok false when there is none or it is an expression.
func literalUserData(files map[string][]byte, r tmpl.Resource) (script string, ok bool) {
	f, diags := parseFile(r.File, files[r.File])
	if diags.HasErrors() {
		return "", false
	}
	blk := resourceBlock(f, r.Name)
	if blk == nil {
		return "", false
	}
	if sb, native := blk.Body.(*hclsyntax.Body); native {
		for _, nb := range sb.Blocks {
			if nb.Type != "labels" || nb.Body.Attributes["value"] == nil {
				continue
			}
			e := nb.Body.Attributes["value"].Expr
			if len(e.Variables()) > 0 {
				return "", false
			}
			v, diags := e.Value(nil)
			if diags.HasErrors() || v.Type() != cty.String || v.IsNull() {
				return "", false
			}
			return v.AsString(), true
		}
		return "", false
	}
	attrs, _ := blk.Body.JustAttributes()
	a := attrs["labels"]
	if a == nil {
		return "", false
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() {
		return "", false
	}
	for _, el := range jsonElems(v) {
		if !el.Type().IsObjectType() || !el.Type().HasAttribute("value") {
			continue
		}
		s := el.GetAttr("value")
		if s.Type() != cty.String || s.IsNull() || strings.Contains(s.AsString(), "${") || strings.Contains(s.AsString(), "%{") {
			return "", false
		}
		return s.AsString(), true
	}
	return "", false
}

// plannedUserData reads the user data label from a machine's planned attributes (labels is a
// set of {label, value} objects in Terraform's plan). Any slice and map types: the store hands
// back its own (bson.A, bson.M).
func plannedUserData(attrs map[string]any) string {
	ls := reflect.ValueOf(attrs["labels"])
	if ls.Kind() != reflect.Slice {
		return ""
	}
	for i := range ls.Len() {
		l := reflect.ValueOf(ls.Index(i).Interface())
		if l.Kind() != reflect.Map || l.Type().Key().Kind() != reflect.String {
			continue
		}
		get := func(k string) string {
			v := l.MapIndex(reflect.ValueOf(k).Convert(l.Type().Key()))
			if !v.IsValid() {
				return ""
			}
			s, _ := v.Interface().(string)
			return s
		}
		if get("label") == UserDataLabel {
			return get("value")
		}
	}
	return ""
}

// userScripts returns the user data of each machine of resource res (ms sorted by index).
func userScripts(cfg *tmpl.Config, res string, ms []*provider.MachineSpec) []string {
	out := make([]string, len(ms))
	var lit string
	var isLit bool
	for _, r := range cfg.Resources(ResourceType) {
		if r.Name == res {
			lit, isLit = literalUserData(cfg.Files(), r)
		}
	}
	for i, m := range ms {
		if isLit {
			out[i] = lit
		} else {
			out[i] = plannedUserData(m.Attributes)
		}
	}
	return out
}

// stripUserData removes the user data labels blocks from every docker_container of the user's
// files (CheckTemplate has made sure they are the only labels blocks). In HCL the block becomes
// a comment of the same number of lines (Terraform's messages keep their line numbers); a
// .tf.json file is re-encoded without the property.
func stripUserData(files map[string][]byte) (map[string][]byte, error) {
	out := maps.Clone(files)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if name == tmpl.GeneratedFile || name == GeneratedFile {
			continue
		}
		src := files[name]
		f, diags := parseFile(name, src)
		if diags.HasErrors() {
			return nil, diags
		}
		if strings.HasSuffix(name, ".tf.json") {
			if !bytes.Contains(src, []byte(`"labels"`)) {
				continue
			}
			b, changed, err := stripJSONLabels(src)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if changed {
				out[name] = b
			}
			continue
		}
		body, ok := f.Body.(*hclsyntax.Body)
		if !ok {
			continue
		}
		var ranges []hcl.Range
		for _, rb := range body.Blocks {
			if rb.Type != "resource" || len(rb.Labels) != 2 || rb.Labels[0] != ResourceType {
				continue
			}
			for _, nb := range rb.Body.Blocks {
				if nb.Type == "labels" {
					ranges = append(ranges, nb.Range())
				}
			}
		}
		if len(ranges) == 0 {
			continue
		}
		sort.Slice(ranges, func(i, j int) bool { return ranges[i].Start.Byte > ranges[j].Start.Byte })
		b := bytes.Clone(src)
		for _, r := range ranges {
			old := b[r.Start.Byte:r.End.Byte]
			text := "# labels " + UserDataLabel + ": in the machine's cloud-init seed (kloud)" + strings.Repeat("\n", bytes.Count(old, []byte{'\n'}))
			b = append(b[:r.Start.Byte:r.Start.Byte], append([]byte(text), b[r.End.Byte:]...)...)
		}
		out[name] = b
	}
	return out, nil
}

// stripJSONLabels deletes "labels" from every docker_container in a .tf.json file ("resource"
// and each level below may be an object or an array of objects, as Terraform's JSON syntax
// allows).
func stripJSONLabels(src []byte) ([]byte, bool, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(src, &top); err != nil {
		return nil, false, err
	}
	changed := false
	// each applies fn to the object raw, or to each object of the array raw, and re-encodes.
	var each func(raw json.RawMessage, fn func(map[string]json.RawMessage) error) (json.RawMessage, error)
	each = func(raw json.RawMessage, fn func(map[string]json.RawMessage) error) (json.RawMessage, error) {
		raw = bytes.TrimSpace(raw)
		if len(raw) > 0 && raw[0] == '[' {
			var arr []json.RawMessage
			if err := json.Unmarshal(raw, &arr); err != nil {
				return nil, err
			}
			for i := range arr {
				var err error
				if arr[i], err = each(arr[i], fn); err != nil {
					return nil, err
				}
			}
			return json.Marshal(arr)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
		if err := fn(m); err != nil {
			return nil, err
		}
		return json.Marshal(m)
	}
	res, ok := top["resource"]
	if !ok {
		return src, false, nil
	}
	res, err := each(res, func(types map[string]json.RawMessage) error {
		dc, ok := types[ResourceType]
		if !ok {
			return nil
		}
		var err error
		types[ResourceType], err = each(dc, func(names map[string]json.RawMessage) error {
			for n, body := range names {
				var err error
				names[n], err = each(body, func(args map[string]json.RawMessage) error {
					if _, ok := args["labels"]; ok {
						delete(args, "labels")
						changed = true
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if !changed {
		return src, false, nil
	}
	top["resource"] = res
	b, err := tmpl.MarshalJSON(top)
	return b, true, err
}

// resourceBlock finds resource docker_container.name in a parsed file.
func resourceBlock(f *hcl.File, name string) *hcl.Block {
	content, _, _ := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "resource", LabelNames: []string{"type", "name"}}}})
	for _, blk := range content.Blocks {
		if blk.Labels[0] == ResourceType && blk.Labels[1] == name {
			return blk
		}
	}
	return nil
}
