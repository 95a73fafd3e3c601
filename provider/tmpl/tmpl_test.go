package tmpl_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// readDir returns the files of a testdata directory as a template.
func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = b
	}
	return files
}

func mustParse(t *testing.T, files map[string][]byte) *tmpl.Config {
	t.Helper()
	c, err := tmpl.Parse(files)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

// fixtures are the same template in both syntaxes; lines differ.
var fixtures = []struct {
	syntax, dir, file string
	lines             map[string]int // resource name (aws_instance) or "var.<name>" → line
}{
	{"hcl", "testdata/hcl", "main.tf", map[string]int{
		"web": 28, "db": 50, "worker": 56, "bare": 61, "oneline": 63,
		"var.aws_access_key": 18, "var.instance_type": 22,
	}},
	{"json", "testdata/json", "main.tf.json", map[string]int{
		"web": 30, "db": 44, "worker": 49, "bare": 53, "oneline": 54,
		"var.aws_access_key": 20, "var.instance_type": 23,
	}},
}

const webScript = "#!/bin/bash\necho \"hello from ${HOSTNAME}\" # not an interpolation\n"

func TestResources(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.syntax, func(t *testing.T) {
			c := mustParse(t, readDir(t, fx.dir))
			want := []tmpl.Resource{
				{Type: "aws_instance", Name: "web", File: fx.file, Line: fx.lines["web"], Count: true},
				{Type: "aws_instance", Name: "db", File: fx.file, Line: fx.lines["db"]},
				{Type: "aws_instance", Name: "worker", File: fx.file, Line: fx.lines["worker"]},
				{Type: "aws_instance", Name: "bare", File: fx.file, Line: fx.lines["bare"]},
				{Type: "aws_instance", Name: "oneline", File: fx.file, Line: fx.lines["oneline"]},
			}
			if got := c.Resources("aws_instance"); !reflect.DeepEqual(got, want) {
				t.Errorf("Resources(aws_instance) =\n%+v\nwant\n%+v", got, want)
			}
			if got := c.Resources(""); len(got) != 6 || got[5].Type != "aws_eip" || !got[5].Count {
				t.Errorf("Resources(\"\") = %+v, want the 5 instances and aws_eip.web with count", got)
			}
			if got := c.Resources("aws_nope"); got != nil {
				t.Errorf("Resources(aws_nope) = %+v", got)
			}
		})
	}
}

func TestLiteralString(t *testing.T) {
	cases := []struct {
		name, attr string
		want       string
		ok         bool
	}{
		{"web", "user_data", webScript, true}, // heredoc (HCL) / string with \n (JSON), $${ unescaped
		{"db", "user_data", "apt-get install -y postgresql", true},
		{"worker", "user_data", "", false},      // interpolation
		{"web", "instance_type", "", false},     // a reference
		{"web", "count", "", false},             // a number, not a string
		{"bare", "user_data", "", false},        // absent
		{"web", "tags.Name", "", false},         // interpolation inside an object
		{"web", "tags.Missing", "", false},      // absent key
		{"web", "ami.x", "", false},             // not an object
		{"oneline", "ami", "ami-1", true},       // one-line block
		{"web", "root_block_device", "", false}, // a nested block (HCL) / object (JSON)
	}
	for _, fx := range fixtures {
		t.Run(fx.syntax, func(t *testing.T) {
			c := mustParse(t, readDir(t, fx.dir))
			for _, tc := range cases {
				got, ok, err := c.LiteralString("aws_instance", tc.name, tc.attr)
				if err != nil || ok != tc.ok || got != tc.want {
					t.Errorf("LiteralString(%s, %s) = %q, %v, %v; want %q, %v, nil", tc.name, tc.attr, got, ok, err, tc.want, tc.ok)
				}
			}
			if _, _, err := c.LiteralString("aws_instance", "nope", "user_data"); err == nil || !strings.Contains(err.Error(), `"aws_instance" "nope" not found`) {
				t.Errorf("unknown resource: err = %v", err)
			}
			if _, _, err := c.LiteralString("aws_instance", "web", "a.b.c"); err != nil {
				t.Errorf("a.b.c (key \"b.c\") should just be absent: %v", err)
			}
			if _, _, err := c.LiteralString("aws_instance", "web", "1x"); err == nil {
				t.Error("invalid attribute name: no error")
			}
		})
	}
}

func TestLiteralAttrs(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.syntax, func(t *testing.T) {
			c := mustParse(t, readDir(t, fx.dir))
			want := map[string]any{
				"count":       int64(2),
				"ami":         "ami-0123456789",
				"monitoring":  true,
				"cpu_credits": int64(-1),
				"user_data":   webScript,
			}
			if got := c.LiteralAttrs("aws_instance", "web"); !reflect.DeepEqual(got, want) {
				t.Errorf("LiteralAttrs(web) = %#v\nwant %#v", got, want)
			}
			if got := c.LiteralAttrs("aws_instance", "bare"); len(got) != 0 {
				t.Errorf("LiteralAttrs(bare) = %#v", got)
			}
			if got := c.LiteralAttrs("aws_instance", "nope"); got != nil {
				t.Errorf("LiteralAttrs(nope) = %#v", got)
			}
		})
	}
}

func TestLiteralNumbers(t *testing.T) {
	for name, src := range map[string]string{
		"n.tf":      "resource \"t_x\" \"a\" {\n  f = 1.5\n  big = 1e30\n  neg = -0.25\n  null_ = null\n  list = [1]\n  e = \"\"\n}\n",
		"n.tf.json": `{"resource": {"t_x": {"a": {"f": 1.5, "big": 1e30, "neg": -0.25, "null_": null, "list": [1], "e": ""}}}}`,
	} {
		c := mustParse(t, map[string][]byte{name: []byte(src)})
		want := map[string]any{"f": 1.5, "big": 1e30, "neg": -0.25, "e": ""}
		if got := c.LiteralAttrs("t_x", "a"); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: LiteralAttrs = %#v, want %#v", name, got, want)
		}
	}
}

func TestVariables(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.syntax, func(t *testing.T) {
			c := mustParse(t, readDir(t, fx.dir))
			want := []tmpl.Variable{
				{Name: "aws_access_key", Sensitive: true, File: fx.file, Line: fx.lines["var.aws_access_key"]},
				{Name: "instance_type", Type: "string", HasDefault: true, File: fx.file, Line: fx.lines["var.instance_type"]},
			}
			if got := c.Variables(); !reflect.DeepEqual(got, want) {
				t.Errorf("Variables() =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

func TestProviders(t *testing.T) {
	for _, fx := range fixtures {
		c := mustParse(t, readDir(t, fx.dir))
		if got := c.Providers(); !reflect.DeepEqual(got, []string{"aws"}) {
			t.Errorf("%s: Providers() = %q", fx.syntax, got)
		}
	}
	c := mustParse(t, map[string][]byte{
		"a.tf": []byte(`
terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}
provider "google" {}
resource "terraform_data" "x" {}
resource "aws_instance" "y" { provider = awsalt.west }
`),
		"b.tf.json": []byte(`{"data": {"http_get": {"z": {"provider": "httpx.east"}}}}`),
	})
	want := []string{"aws", "awsalt", "google", "http", "httpx", "kloudlocal", "terraform"}
	if got := c.Providers(); !reflect.DeepEqual(got, want) {
		t.Errorf("Providers() = %q, want %q", got, want)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  []string // substrings of the error
	}{
		{"no files", map[string]string{}, []string{"no files"}},
		{"extension", map[string]string{"main.hcl": ""}, []string{"main.hcl: not a Terraform file"}},
		{"tfvars", map[string]string{"main.tf": "", "x.tfvars": ""}, []string{"x.tfvars: not a Terraform file"}},
		{"subdir", map[string]string{"mod/main.tf": ""}, []string{"mod/main.tf: subdirectories are not supported"}},
		{"reserved", map[string]string{tmpl.GeneratedFile: `{"resource": {"a_b": {"c": {}}}}`}, []string{tmpl.GeneratedFile + ": the name is reserved"}},
		{"reserved with extra", map[string]string{tmpl.GeneratedFile: `{"variable": {"a": {"default": 1}}}`}, []string{"reserved"}},
		{"override", map[string]string{"main.tf": "", "web_override.tf": ""}, []string{"web_override.tf: override files"}},
		{"override json", map[string]string{"override.tf.json": "{}"}, []string{"override.tf.json: override files"}},
		{"hidden", map[string]string{".x.tf": ""}, []string{".x.tf: terraform ignores"}},
		{"case", map[string]string{"Main.tf": "", "main.tf": ""}, []string{"main.tf: duplicate file name", `"Main.tf"`}},
		{"utf8", map[string]string{"main.tf": "# ok\n# caf\xe9\n"}, []string{"main.tf:2:6: file is not valid UTF-8"}},
		{"hcl syntax", map[string]string{"main.tf": "resource \"a\" \"b\" {\n  x = \n}\n"},
			[]string{"main.tf:2:7: Invalid expression"}},
		{"hcl unclosed", map[string]string{"ok.tf": "", "main.tf": "locals {\n  a = 1\n"},
			[]string{"main.tf:1:8: Unclosed configuration block"}},
		{"json syntax", map[string]string{"main.tf.json": "{\n  \"resource\": {,}\n}"},
			[]string{"main.tf.json:2:16: Invalid start of value"}},
		{"json trailing comma", map[string]string{"main.tf.json": "{\"locals\": {\"a\": 1,}}"},
			[]string{"main.tf.json:1:"}},
		{"missing label", map[string]string{"main.tf": "resource \"aws_instance\" {\n}\n"},
			[]string{"main.tf:1:25: Missing name for resource"}},
		{"json wrong shape", map[string]string{"main.tf.json": `{"resource": "x"}`},
			[]string{"main.tf.json:1:14:"}},
		{"duplicate resource", map[string]string{
			"a.tf":      "resource \"aws_instance\" \"web\" {}\n",
			"b.tf.json": "{\"resource\": {\"aws_instance\": {\"web\": {}}}}",
		}, []string{`b.tf.json:1:32: duplicate resource "aws_instance" "web": already declared at a.tf:1:1`}},
		{"duplicate variable", map[string]string{"a.tf": "variable \"x\" {}\nvariable \"x\" {}\n"},
			[]string{`a.tf:2:1: duplicate variable "x"`}},
		{"two errors", map[string]string{"a.tf": "x = \n", "b.tf": "y = \n"}, []string{"a.tf:1:", "b.tf:1:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string][]byte{}
			for n, s := range tc.files {
				files[n] = []byte(s)
			}
			_, err := tmpl.Parse(files)
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			var pe *tmpl.ParseError
			if len(tc.files) > 0 && !errors.As(err, &pe) {
				t.Errorf("error %v is not a *ParseError", err)
			}
		})
	}
}

func TestParseCopiesInput(t *testing.T) {
	files := map[string][]byte{"main.tf": []byte("resource \"t_x\" \"a\" {\n  user_data = \"x\"\n}\n")}
	c := mustParse(t, files)
	files["main.tf"][0] = '#'
	if v, ok, _ := c.LiteralString("t_x", "a", "user_data"); !ok || v != "x" {
		t.Fatalf("config changed with its input: %q %v", v, ok)
	}
	out := c.Files()
	out["main.tf"][0] = '#'
	if c.Files()["main.tf"][0] != 'r' {
		t.Fatal("Files() returned the config's own bytes")
	}
}

func TestValidate(t *testing.T) {
	machines := map[string]string{"aws_instance": "user_data", "google_compute_instance": "metadata.user-data", "vagrant_instance": ""}
	cases := []struct {
		name string
		file string
		src  string
		want []string // nil: valid
	}{
		{"ok", "main.tf", `
resource "aws_instance" "a" {
  count     = 3
  user_data = "echo hi"
}
resource "aws_instance" "b" {}
resource "aws_eip" "c" {
  for_each = toset(["x"])
}
resource "google_compute_instance" "d" {
  metadata = { user-data = "echo", other = var.x }
}
resource "google_compute_instance" "e" {
  metadata = { other = var.x }
}
resource "vagrant_instance" "f" {
  user_data = var.anything
}
`, nil},
		{"for_each", "main.tf", `
resource "aws_instance" "a" {
  for_each = toset(["x", "y"])
}
`, []string{`main.tf:2: resource "aws_instance" "a": for_each is not supported on machine resources; use count for machine resources`}},
		{"for_each json", "main.tf.json", `{"resource": {"aws_instance": {
  "a": {"for_each": "${toset([\"x\"])}"}}}}`,
			[]string{`main.tf.json:2: resource "aws_instance" "a": for_each is not supported`, "use count for machine resources"}},
		{"expression", "main.tf", `
resource "aws_instance" "a" {
  user_data = templatefile("init.sh", {})
}
resource "aws_instance" "b" {
  user_data = "echo ${var.x}"
}
`, []string{`main.tf:2: resource "aws_instance" "a": user_data must be a literal string`, `main.tf:5: resource "aws_instance" "b": user_data must be`}},
		{"nested expression", "main.tf", `
resource "google_compute_instance" "a" {
  metadata = { "user-data" = file("x") }
}
resource "google_compute_instance" "b" {
  metadata = merge(var.m, {})
}
`, []string{`main.tf:2: resource "google_compute_instance" "a": metadata.user-data must be a literal`, `main.tf:5: resource "google_compute_instance" "b": metadata must be an object`}},
		{"json expression", "main.tf.json", `{"resource": {"aws_instance": {"a": {"user_data": "${file(\"x\")}"}}}}`,
			[]string{`main.tf.json:1: resource "aws_instance" "a": user_data must be a literal`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, map[string][]byte{tc.file: []byte(tc.src)})
			err := c.Validate(machines)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
