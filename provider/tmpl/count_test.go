package tmpl_test

import "testing"

func TestCount(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string][]byte
		vars  map[string]any
		n     int64
		known bool
	}{
		{"none", map[string][]byte{"main.tf": []byte(`resource "m" "a" {}`)}, nil, 1, true},
		{"literal", map[string][]byte{"main.tf": []byte(`resource "m" "a" { count = 100000 }`)}, nil, 100000, true},
		{"default", map[string][]byte{"main.tf": []byte("variable \"n\" {\n  type = number\n  default = 100000\n}\nresource \"m\" \"a\" { count = var.n }")}, nil, 100000, true},
		{"given", map[string][]byte{"main.tf": []byte("variable \"n\" { default = 1 }\nresource \"m\" \"a\" { count = var.n * 2 }")}, map[string]any{"n": "50000"}, 100000, true},
		{"no value", map[string][]byte{"main.tf": []byte("variable \"n\" {}\nresource \"m\" \"a\" { count = var.n }")}, nil, 0, false},
		{"local", map[string][]byte{"main.tf": []byte("variable \"n\" { default = 2 }\nlocals {\n  n = local.m * 3\n  m = var.n > 1 ? var.n : 1\n}\nresource \"m\" \"a\" { count = local.n }")}, nil, 6, true},
		{"local cycle", map[string][]byte{"main.tf": []byte("locals {\n  a = local.b\n  b = local.a\n}\nresource \"m\" \"a\" { count = local.a }")}, nil, 0, false},
		{"for", map[string][]byte{"main.tf": []byte("locals { l = [for i in [1, 2, 3] : i] }\nresource \"m\" \"a\" { count = local.l[0] }")}, nil, 0, false},
		{"resource", map[string][]byte{"main.tf": []byte("resource \"m\" \"b\" {}\nresource \"m\" \"a\" { count = m.b.n }")}, nil, 0, false},
		{"json number", map[string][]byte{"main.tf.json": []byte(`{"resource": {"m": {"a": {"count": 100000}}}}`)}, nil, 100000, true},
		{"json local", map[string][]byte{"main.tf.json": []byte(`{"locals": {"n": "${2 * 3}"}, "resource": {"m": {"a": {"count": "${local.n}"}}}}`)}, nil, 6, true},
		{"function", map[string][]byte{"main.tf": []byte(`resource "m" "a" { count = max(1, 2) }`)}, nil, 0, false},
		{"json", map[string][]byte{"main.tf.json": []byte(`{"variable": {"n": {"default": 7}}, "resource": {"m": {"a": {"count": "${var.n}"}}}}`)}, nil, 7, true},
		{"fraction", map[string][]byte{"main.tf": []byte(`resource "m" "a" { count = 1.5 }`)}, nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, known, err := mustParse(t, tc.files).Count("m", "a", tc.vars)
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.n || known != tc.known {
				t.Fatalf("Count = %d, %v; want %d, %v", n, known, tc.n, tc.known)
			}
		})
	}
}
