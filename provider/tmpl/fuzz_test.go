package tmpl_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

// FuzzRewrite parses any file as a template and rewrites every resource's user data, plain and
// nested: nothing may panic, and a rewrite may fail only for a user data attribute that is not
// an object constructor, never by producing invalid syntax.
func FuzzRewrite(f *testing.F) {
	for _, dir := range []string{"testdata/hcl", "testdata/json", "testdata/roundtrip/hcl", "testdata/roundtrip/hcl_nested", "testdata/roundtrip/json"} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err == nil {
				f.Add(strings.HasSuffix(e.Name(), ".json"), b)
			}
		}
	}
	f.Add(false, []byte("resource \"a_b\" \"c\" { x = 1 }\n"))
	f.Add(true, []byte(`{"resource": [{"a_b": {"c": [{"metadata": {}}]}}]}`))
	f.Fuzz(func(t *testing.T, isJSON bool, src []byte) {
		name := "main.tf"
		if isJSON {
			name = "main.tf.json"
		}
		c, err := tmpl.Parse(map[string][]byte{name: src})
		if err != nil {
			return
		}
		c.Providers()
		c.Variables()
		c.CheckSecretRefs([]string{"s"})
		c.Validate(map[string]string{"a_b": "user_data"})
		for _, attr := range []string{"user_data", "metadata.user-data"} {
			for _, r := range c.Resources("") {
				c.LiteralString(r.Type, r.Name, attr)
				c.LiteralAttrs(r.Type, r.Name)
				err := c.SetUserData(r.Type, r.Name, attr, "v")
				if err != nil && !strings.Contains(err.Error(), "not an object constructor") {
					t.Fatalf("SetUserData(%s.%s, %s): %v", r.Type, r.Name, attr, err)
				}
			}
		}
		if _, err := tmpl.Parse(c.Files()); err != nil {
			t.Fatalf("output does not parse: %v", err)
		}
	})
}
