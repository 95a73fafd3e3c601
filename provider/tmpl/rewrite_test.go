package tmpl_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

// rewriteMachines does what kloud does before apply: every aws_instance gets its user data from
// a kloud variable; the credentials are declared as sensitive variables.
func rewriteMachines(t *testing.T, c *tmpl.Config, typ, attr string) {
	t.Helper()
	for _, r := range c.Resources(typ) {
		v := "kloud_user_data_" + r.Name
		if err := c.SetUserData(r.Type, r.Name, attr, v); err != nil {
			t.Fatalf("SetUserData(%s): %v", r.Name, err)
		}
		typeExpr := "string"
		if r.Count {
			typeExpr = "list(string)"
		}
		if err := c.DeclareVariable(v, typeExpr, true); err != nil {
			t.Fatalf("DeclareVariable(%s): %v", v, err)
		}
	}
}

func TestSetUserDataGolden(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.syntax, func(t *testing.T) {
			orig := readDir(t, fx.dir)
			c := mustParse(t, orig)
			rewriteMachines(t, c, "aws_instance", "user_data")
			for _, v := range []string{"aws_access_key", "aws_secret_key"} {
				if err := c.DeclareVariable(v, "string", true); err != nil {
					t.Fatalf("DeclareVariable(%s): %v", v, err)
				}
			}
			files := c.Files()
			golden := filepath.Join("testdata/golden", fx.syntax)
			if *update {
				os.RemoveAll(golden)
				os.MkdirAll(golden, 0o755)
				for n, b := range files {
					if err := os.WriteFile(filepath.Join(golden, n), b, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			want := readDir(t, golden)
			if len(files) != len(want) {
				t.Errorf("files %d, golden %d", len(files), len(want))
			}
			for n, b := range want {
				if !bytes.Equal(files[n], b) {
					t.Errorf("%s differs from %s (run go test -update and review the diff):\n%s", n, golden, files[n])
				}
			}

			// Every line of the original outside the user_data values survives; in HCL that
			// includes every comment.
			out := string(files[fx.file])
			for _, line := range strings.Split(string(orig[fx.file]), "\n") {
				if strings.Contains(line, "user_data") || strings.Contains(line, "#!/bin/bash") ||
					strings.Contains(line, "hello from") || strings.TrimSpace(line) == "EOT" ||
					strings.Contains(line, `"bare"`) || strings.Contains(line, `"oneline"`) {
					continue
				}
				if !strings.Contains(out, line) {
					t.Errorf("line %q lost", line)
				}
			}

			// The result parses, the user data is no longer literal, the variables are
			// declared, and no secret leaked.
			c2 := mustParse(t, files)
			for _, r := range c2.Resources("aws_instance") {
				if _, ok, _ := c2.LiteralString(r.Type, r.Name, "user_data"); ok {
					t.Errorf("%s: user_data still literal", r.Name)
				}
			}
			var names []string
			for _, v := range c2.Variables() {
				names = append(names, v.Name+":"+v.File)
				if strings.HasPrefix(v.Name, "kloud_") && (!v.Sensitive || v.HasDefault) {
					t.Errorf("generated %+v", v)
				}
			}
			wantNames := []string{"aws_access_key:" + fx.file, "instance_type:" + fx.file,
				"aws_secret_key:" + tmpl.GeneratedFile,
				"kloud_user_data_bare:" + tmpl.GeneratedFile, "kloud_user_data_db:" + tmpl.GeneratedFile,
				"kloud_user_data_oneline:" + tmpl.GeneratedFile, "kloud_user_data_web:" + tmpl.GeneratedFile,
				"kloud_user_data_worker:" + tmpl.GeneratedFile}
			if !reflect.DeepEqual(names, wantNames) {
				t.Errorf("variables %q\nwant %q", names, wantNames)
			}
			if err := c2.CheckSecretRefs(secrets); err != nil {
				t.Error(err)
			}
			if err := c2.Validate(map[string]string{"aws_instance": "user_data"}); err == nil {
				t.Error("Validate of the rewritten template passed; user_data is no longer literal")
			}
		})
	}
}

func TestSetUserDataEdits(t *testing.T) {
	cases := []struct {
		name, file, attr string
		in, want         string
		err              string
	}{
		{"quoted, comment kept", "m.tf", "user_data",
			"resource \"t_m\" \"a\" {\n  user_data = \"x\" # keep\n  ami = 1\n}\n",
			"resource \"t_m\" \"a\" {\n  user_data = var.v # keep\n  ami = 1\n}\n", ""},
		{"heredoc with count", "m.tf", "user_data",
			"resource \"t_m\" \"a\" {\n  count = 2\n  user_data = <<EOT\nx\nEOT\n  ami = \"y\"\n}\n",
			"resource \"t_m\" \"a\" {\n  count = 2\n  user_data = var.v[count.index]\n  ami = \"y\"\n}\n", ""},
		{"expression", "m.tf", "user_data",
			"resource \"t_m\" \"a\" {\n  user_data = templatefile(\"x\", { a = 1 }) /* c */\n}\n",
			"resource \"t_m\" \"a\" {\n  user_data = var.v /* c */\n}\n", ""},
		{"absent", "m.tf", "user_data",
			"# head\nresource \"t_m\" \"a\" {\n    ami = \"y\" # c\n\n    root {\n      x = 1\n    }\n}\n# tail\n",
			"# head\nresource \"t_m\" \"a\" {\n    ami = \"y\" # c\n\n    root {\n      x = 1\n    }\n    user_data = var.v\n}\n# tail\n", ""},
		{"absent, empty block", "m.tf", "user_data",
			"resource \"t_m\" \"a\" {}\nresource \"t_m\" \"b\" {}\n",
			"resource \"t_m\" \"a\" {\n  user_data = var.v\n}\nresource \"t_m\" \"b\" {}\n", ""},
		{"absent, empty block on lines", "m.tf", "user_data",
			"resource \"t_m\" \"a\" {\n}\n",
			"resource \"t_m\" \"a\" {\n  user_data = var.v\n}\n", ""},
		{"absent, one-line block", "m.tf", "user_data",
			"resource \"t_m\" \"a\" { ami = \"y\" }\n",
			"resource \"t_m\" \"a\" {\n  ami = \"y\"\n  user_data = var.v\n}\n", ""},
		{"key", "m.tf", "metadata.user-data",
			"resource \"t_m\" \"a\" {\n  metadata = {\n    user-data = \"x\" # c\n    other     = 1\n  }\n}\n",
			"resource \"t_m\" \"a\" {\n  metadata = {\n    user-data = var.v # c\n    other     = 1\n  }\n}\n", ""},
		{"quoted key", "m.tf", "metadata.user-data",
			"resource \"t_m\" \"a\" {\n  metadata = { \"user-data\" : \"x\", other = 1 }\n}\n",
			"resource \"t_m\" \"a\" {\n  metadata = { \"user-data\" : var.v, other = 1 }\n}\n", ""},
		{"key absent", "m.tf", "metadata.user-data",
			"resource \"t_m\" \"a\" {\n  metadata = {\n    other = 1\n  }\n}\n",
			"resource \"t_m\" \"a\" {\n  metadata = {\n    user-data = var.v\n    other = 1\n  }\n}\n", ""},
		{"key absent, one line", "m.tf", "metadata.user-data",
			"resource \"t_m\" \"a\" {\n  metadata = { other = 1 }\n}\n",
			"resource \"t_m\" \"a\" {\n  metadata = { user-data = var.v, other = 1 }\n}\n", ""},
		{"key absent, tight", "m.tf", "metadata.user-data",
			"resource \"t_m\" \"a\" {\n  metadata = {other = 1}\n}\n",
			"resource \"t_m\" \"a\" {\n  metadata = {user-data = var.v, other = 1}\n}\n", ""},
		{"key absent, empty", "m.tf", "metadata.user data",
			"resource \"t_m\" \"a\" {\n  metadata = {}\n}\n",
			"resource \"t_m\" \"a\" {\n  metadata = { \"user data\" = var.v }\n}\n", ""},
		{"attribute absent, key", "m.tf", "metadata.user-data",
			"resource \"t_m\" \"a\" {\n  count = 1\n}\n",
			"resource \"t_m\" \"a\" {\n  count = 1\n  metadata = { user-data = var.v[count.index] }\n}\n", ""},
		{"not an object", "m.tf", "metadata.user-data",
			"resource \"t_m\" \"a\" {\n  metadata = merge({}, {})\n}\n", "", "metadata is not an object constructor"},
		{"for expression", "m.tf", "metadata.user-data",
			"resource \"t_m\" \"a\" {\n  metadata = { for k in [] : k => k }\n}\n", "", "metadata is not an object constructor"},
		{"unknown resource", "m.tf", "user_data", "resource \"t_m\" \"b\" {}\n", "", `"t_m" "a" not found`},

		{"json quoted", "m.tf.json", "user_data",
			"{\"resource\": {\"t_m\": {\"a\": {\n  \"user_data\": \"x\",\n  \"ami\": 1\n}}}}\n",
			"{\"resource\": {\"t_m\": {\"a\": {\n  \"user_data\": \"${var.v}\",\n  \"ami\": 1\n}}}}\n", ""},
		{"json count", "m.tf.json", "user_data",
			"{\"resource\": {\"t_m\": {\"a\": {\"count\": 2, \"user_data\": \"${file(\\\"x\\\")}\"}}}}",
			"{\"resource\": {\"t_m\": {\"a\": {\"count\": 2, \"user_data\": \"${var.v[count.index]}\"}}}}", ""},
		{"json absent", "m.tf.json", "user_data",
			"{\n  \"resource\": {\n    \"t_m\": {\n      \"a\": {\n        \"ami\": 1\n      }\n    }\n  }\n}\n",
			"{\n  \"resource\": {\n    \"t_m\": {\n      \"a\": {\n        \"user_data\": \"${var.v}\",\n        \"ami\": 1\n      }\n    }\n  }\n}\n", ""},
		{"json absent, empty", "m.tf.json", "user_data",
			"{\"resource\": {\"t_m\": {\"a\": {}, \"b\": {}}}}",
			"{\"resource\": {\"t_m\": {\"a\": {\"user_data\": \"${var.v}\"}, \"b\": {}}}}", ""},
		{"json absent, empty on lines", "m.tf.json", "user_data",
			"{\"resource\": {\"t_m\": {\"a\": {\n    }}}}",
			"{\"resource\": {\"t_m\": {\"a\": {\n      \"user_data\": \"${var.v}\"\n    }}}}", ""},
		{"json array of bodies", "m.tf.json", "user_data",
			"{\"resource\": [{\"t_m\": {\"a\": [{\"ami\": 1}]}}]}",
			"{\"resource\": [{\"t_m\": {\"a\": [{\"user_data\": \"${var.v}\", \"ami\": 1}]}}]}", ""},
		{"json key", "m.tf.json", "metadata.user-data",
			"{\"resource\": {\"t_m\": {\"a\": {\"metadata\": {\"user-data\": \"x\", \"o\": 1}}}}}",
			"{\"resource\": {\"t_m\": {\"a\": {\"metadata\": {\"user-data\": \"${var.v}\", \"o\": 1}}}}}", ""},
		{"json absent, spaced", "m.tf.json", "user_data",
			"{\"resource\": {\"t_m\": {\"x\": [{\"ami\": 2}], \"a\": [ { \"ami\": 1 } ]}}}",
			"{\"resource\": {\"t_m\": {\"x\": [{\"ami\": 2}], \"a\": [ { \"user_data\": \"${var.v}\", \"ami\": 1 } ]}}}", ""},
		{"json key absent", "m.tf.json", "metadata.user-data",
			"{\"resource\": {\"t_m\": {\"a\": {\"metadata\": {\"o\": 1}}}}}",
			"{\"resource\": {\"t_m\": {\"a\": {\"metadata\": {\"user-data\": \"${var.v}\", \"o\": 1}}}}}", ""},
		{"json attribute absent, key", "m.tf.json", "metadata.user-data",
			"{\"resource\": {\"t_m\": {\"a\": {\"o\": 1}}}}",
			"{\"resource\": {\"t_m\": {\"a\": {\"metadata\": {\"user-data\": \"${var.v}\"}, \"o\": 1}}}}", ""},
		{"json not an object", "m.tf.json", "metadata.user-data",
			"{\"resource\": {\"t_m\": {\"a\": {\"metadata\": \"${var.m}\"}}}}", "", "metadata is not an object constructor"},
		{"json unicode kept", "m.tf.json", "user_data",
			"{\"resource\": {\"t_m\": {\"a\": {\"user_data\": \"caf\\u00e9 <&>\", \"tag\": \"café <&>\"}}}}",
			"{\"resource\": {\"t_m\": {\"a\": {\"user_data\": \"${var.v}\", \"tag\": \"café <&>\"}}}}", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, map[string][]byte{tc.file: []byte(tc.in)})
			err := c.SetUserData("t_m", "a", tc.attr, "v")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				if got := string(c.Files()[tc.file]); got != tc.in {
					t.Errorf("file changed on error:\n%s", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("SetUserData: %v", err)
			}
			got := string(c.Files()[tc.file])
			if got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
			// Setting it again changes nothing more.
			if err := c.SetUserData("t_m", "a", tc.attr, "v"); err != nil {
				t.Fatal(err)
			}
			if again := string(c.Files()[tc.file]); again != got {
				t.Errorf("second SetUserData changed the file:\n%s", again)
			}
		})
	}
}

func TestSetUserDataBadNames(t *testing.T) {
	c := mustParse(t, map[string][]byte{"m.tf": []byte("resource \"t_m\" \"a\" {}\n")})
	for _, tc := range []struct{ attr, v string }{{"user_data", "1bad"}, {"user_data", "a.b"}, {"", "v"}, {"x.", "v"}, {"a b", "v"}} {
		if err := c.SetUserData("t_m", "a", tc.attr, tc.v); err == nil {
			t.Errorf("SetUserData(%q, %q) succeeded", tc.attr, tc.v)
		}
	}
	if got := string(c.Files()["m.tf"]); got != "resource \"t_m\" \"a\" {}\n" {
		t.Errorf("file changed: %s", got)
	}
}

func TestDeclareVariable(t *testing.T) {
	c := mustParse(t, map[string][]byte{"v.tf": []byte(`
variable "secret_ok" {
  type      = string
  sensitive = true
}
variable "secret_plain" {}
variable "plain" {}
`)})
	for _, tc := range []struct {
		name, typ string
		sensitive bool
		err       string
	}{
		{"1x", "string", false, "not a valid identifier"},
		{"count", "string", false, "reserved"},
		{"x", "list(", false, `type "list("`},
		{"x", "strin", false, `type "strin"`},
		{"x", "var.y", false, `type "var.y"`},
		{"secret_plain", "string", true, "v.tf:6 without sensitive = true"},
	} {
		if err := c.DeclareVariable(tc.name, tc.typ, tc.sensitive); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("DeclareVariable(%q, %q, %v) = %v, want %q", tc.name, tc.typ, tc.sensitive, err, tc.err)
		}
	}
	if _, ok := c.Files()[tmpl.GeneratedFile]; ok {
		t.Fatal("failed declarations wrote the generated file")
	}
	// The user's compatible declarations stay theirs.
	for _, tc := range []struct {
		name      string
		sensitive bool
	}{{"secret_ok", true}, {"plain", false}, {"secret_plain", false}} {
		if err := c.DeclareVariable(tc.name, "string", tc.sensitive); err != nil {
			t.Errorf("DeclareVariable(%s): %v", tc.name, err)
		}
	}
	if _, ok := c.Files()[tmpl.GeneratedFile]; ok {
		t.Fatal("user-declared variables went into the generated file")
	}
	for _, tc := range []struct {
		name, typ string
		sensitive bool
	}{
		{"kloud_b", "list(string)", true},
		{"kloud_a", "", false},
		{"kloud_c", "object({ a = optional(string, \"x\") })", false},
		{"kloud_b", "string", true}, // replaces
	} {
		if err := c.DeclareVariable(tc.name, tc.typ, tc.sensitive); err != nil {
			t.Fatalf("DeclareVariable(%s): %v", tc.name, err)
		}
	}
	want := `{
  "//": "Generated by kloud. Do not edit.",
  "variable": {
    "kloud_a": {},
    "kloud_b": {"type":"string","sensitive":true},
    "kloud_c": {"type":"object({ a = optional(string, \"x\") })"}
  }
}
`
	if got := string(c.Files()[tmpl.GeneratedFile]); got != want {
		t.Errorf("generated file\n%s\nwant\n%s", got, want)
	}
	var gen []tmpl.Variable
	for _, v := range c.Variables() {
		if v.File == tmpl.GeneratedFile {
			gen = append(gen, v)
		}
	}
	wantVars := []tmpl.Variable{
		{Name: "kloud_a", File: tmpl.GeneratedFile, Line: 4},
		{Name: "kloud_b", Type: "string", Sensitive: true, File: tmpl.GeneratedFile, Line: 5},
		{Name: "kloud_c", Type: `object({ a = optional(string, "x") })`, File: tmpl.GeneratedFile, Line: 6},
	}
	if !reflect.DeepEqual(gen, wantVars) {
		t.Errorf("Variables() generated part =\n%+v\nwant\n%+v", gen, wantVars)
	}
	// The output parses again, generated file and all, and declaring more keeps what is there.
	c2, err := tmpl.Parse(c.Files())
	if err != nil {
		t.Fatalf("Parse of the output: %v", err)
	}
	if !reflect.DeepEqual(c2.Variables(), c.Variables()) {
		t.Errorf("Variables() after Parse =\n%+v\nwant\n%+v", c2.Variables(), c.Variables())
	}
	if err := c2.DeclareVariable("kloud_d", "number", false); err != nil {
		t.Fatal(err)
	}
	want = strings.Replace(want, "\n  }\n}", ",\n    \"kloud_d\": {\"type\":\"number\"}\n  }\n}", 1)
	if got := string(c2.Files()[tmpl.GeneratedFile]); got != want {
		t.Errorf("generated file after Parse and DeclareVariable\n%s\nwant\n%s", got, want)
	}
}
