package tmpl

import (
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
)

// AddBlocks inserts nested blocks that parse back as blocks, in native syntax and in JSON.
func TestAddBlocks(t *testing.T) {
	for name, src := range map[string]string{
		"main.tf":      "resource \"docker_container\" \"vm\" {\n  count = 2\n  name  = \"x\"\n}\n\nresource \"docker_container\" \"one\" { name = \"y\" }\n",
		"main.tf.json": `{"resource": {"docker_container": {"vm": {"count": 2, "name": "x"}, "one": {"name": "y"}}}}`,
	} {
		c, err := Parse(map[string][]byte{name: []byte(src)})
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range []string{"vm", "one"} {
			err := c.AddBlocks("docker_container", res, "labels", []map[string]string{
				{"label": `"a"`, "value": "var.a[count.index]"},
				{"label": `"b"`, "value": `"two"`},
			})
			if err != nil {
				t.Fatalf("%s %s: %v", name, res, err)
			}
		}
		out := c.Files()[name]
		var f *hcl.File
		var diags hcl.Diagnostics
		if strings.HasSuffix(name, ".json") {
			f, diags = hcljson.Parse(out, name)
		} else {
			f, diags = hclsyntax.ParseConfig(out, name, hcl.InitialPos)
		}
		if diags.HasErrors() {
			t.Fatalf("%s: %v\n%s", name, diags, out)
		}
		top, _, _ := f.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "resource", LabelNames: []string{"t", "n"}}}})
		if len(top.Blocks) != 2 {
			t.Fatalf("%s: %d resources\n%s", name, len(top.Blocks), out)
		}
		for _, r := range top.Blocks {
			inner, _, diags := r.Body.PartialContent(&hcl.BodySchema{
				Attributes: []hcl.AttributeSchema{{Name: "name"}, {Name: "count"}},
				Blocks:     []hcl.BlockHeaderSchema{{Type: "labels"}},
			})
			if diags.HasErrors() || len(inner.Blocks) != 2 {
				t.Fatalf("%s %s: %d labels blocks, %v\n%s", name, r.Labels[1], len(inner.Blocks), diags, out)
			}
			attrs, diags := inner.Blocks[1].Body.JustAttributes()
			if diags.HasErrors() || attrs["label"] == nil || attrs["value"] == nil {
				t.Fatalf("%s: second block: %v %v\n%s", name, attrs, diags, out)
			}
			if v, d := attrs["label"].Expr.Value(&hcl.EvalContext{}); d.HasErrors() || v.AsString() != "b" {
				t.Errorf("%s: label = %v %v", name, v, d)
			}
		}
	}
}
