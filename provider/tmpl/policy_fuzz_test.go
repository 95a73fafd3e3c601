package tmpl_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

// FuzzCheckPolicy checks any template that parses against the policy: nothing may panic, and
// every refusal is a *PolicyError with a place and a known rule.
func FuzzCheckPolicy(f *testing.F) {
	for _, dir := range []string{"testdata/hcl", "testdata/json"} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
				f.Add(strings.HasSuffix(e.Name(), ".json"), b)
			}
		}
	}
	f.Add(false, []byte("check \"c\" {\n  data \"http\" {}\n  data \"a\" \"b\" \"c\" {}\n}\nprovider {}\nmodule {}\n"))
	f.Add(true, []byte(`{"check": {"c": {"data": {"http": "x"}}}, "provider": [], "terraform": [{"backend": 1}]}`))
	f.Add(false, []byte("resource \"terraform_data\" \"x\" {\n  provisioner \"local-exec\" { command = file(path.module) }\n}\n"))
	f.Fuzz(func(t *testing.T, isJSON bool, src []byte) {
		name := "main.tf"
		if isJSON {
			name = "main.tf.json"
		}
		c, err := tmpl.Parse(map[string][]byte{name: src})
		if err != nil {
			return
		}
		err = c.CheckPolicy(testPolicy)
		if err == nil {
			return
		}
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			pe, ok := e.(*tmpl.PolicyError)
			if !ok || pe.File != name || pe.Line < 1 {
				t.Fatalf("refusal without a place: %#v", e)
			}
			known := false
			for _, r := range tmpl.PolicyRules {
				known = known || r == pe.Rule
			}
			if !known {
				t.Fatalf("unknown rule in %v", pe)
			}
		}
	})
}

// TestPolicyMangled checks every prefix, and the text with each line dropped, of templates
// with every construct the policy knows: nothing may panic (the fuzzer explores further).
func TestPolicyMangled(t *testing.T) {
	srcs := map[string]string{
		"main.tf": `terraform {
  backend "local" { path = "/x" }
  required_providers { kloudlocal = { source = "kloud/kloudlocal" } }
}
provider "kloudlocal" { a = 1 }
module "m" { source = "/x" }
check "c" {
  data "http" "x" { url = "http://x/" }
}
resource "terraform_data" "x" {
  input = [for path in [1] : { path = file("/x") }]
  provisioner "local-exec" { command = "${path.module}" }
  dynamic "provisioner" { for_each = [] }
}
removed { from = a.b }
`,
		"main.tf.json": `{"terraform": {"backend": {"local": {"path": "/x"}}},
"check": {"c": {"data": {"http": {"x": {"url": "${file(\"/x\")}"}}}}},
"resource": [{"terraform_data": {"x": {"provisioner": [{"local-exec": {"command": "${path.cwd}"}}]}}}],
"variable": {"v": {"type": "list(string)"}},
"module": {"m": {"source": "/x"}}}`,
	}
	for name, src := range srcs {
		var variants []string
		for i := range len(src) {
			variants = append(variants, src[:i])
		}
		lines := strings.Split(src, "\n")
		for i := range lines {
			variants = append(variants, strings.Join(append(append([]string{}, lines[:i]...), lines[i+1:]...), "\n"))
		}
		for _, v := range variants {
			c, err := tmpl.Parse(map[string][]byte{name: []byte(v)})
			if err != nil {
				continue
			}
			c.CheckPolicy(testPolicy)
		}
	}
}
