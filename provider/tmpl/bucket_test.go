package tmpl_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

func parseFiles(t *testing.T, files map[string]string) *tmpl.Config {
	t.Helper()
	in := map[string][]byte{}
	for n, s := range files {
		in[n] = []byte(s)
	}
	c, err := tmpl.Parse(in)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return c
}

const bucketHCL = `resource "terraform_data" "box" {
  input = { user_data = "" }
}

resource "kloud_bucket" "cache" {
  retain      = false
  max_size_mb = 1024
}

resource "kloud_bucket" "data-2" {
  retain   = true
  provider = "local"
}

output "x" { value = terraform_data.box.id }
`

const bucketJSON = `{
  "resource": {
    "terraform_data": {"box2": {"input": {"user_data": ""}}},
    "kloud_bucket": {"logs": {"retain": true, "max_size_mb": 5}}
  }
}
`

// Buckets reads the blocks; RemoveBuckets leaves a template without them that parses, keeps the
// other resources and (HCL) the lines where they were; the policy accepts the type.
func TestBuckets(t *testing.T) {
	c := parseFiles(t, map[string]string{"main.tf": bucketHCL, "more.tf.json": bucketJSON})
	if err := c.CheckPolicy(testPolicy); err != nil {
		t.Fatalf("policy refused kloud_bucket: %v", err)
	}
	got, err := c.Buckets()
	if err != nil {
		t.Fatal(err)
	}
	want := []tmpl.BucketDecl{
		{Label: "cache", MaxSizeMB: 1024, File: "main.tf", Line: 5},
		{Label: "data-2", Retain: true, Provider: "local", File: "main.tf", Line: 10},
		{Label: "logs", Retain: true, MaxSizeMB: 5, File: "more.tf.json", Line: 4},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Buckets:\n got %+v\nwant %+v", got, want)
	}
	if err := c.RemoveBuckets(); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Resources(tmpl.BucketType)); n != 0 {
		t.Fatalf("%d kloud_bucket resources left", n)
	}
	if n := len(c.Resources("terraform_data")); n != 2 {
		t.Fatalf("terraform_data resources: %d, want 2", n)
	}
	files := c.Files()
	for name, src := range files {
		if strings.Contains(string(src), "kloud_bucket\"") || strings.Contains(string(src), `"kloud_bucket"`) {
			t.Errorf("%s still has a kloud_bucket:\n%s", name, src)
		}
	}
	if a, b := strings.Count(bucketHCL, "\n"), strings.Count(string(files["main.tf"]), "\n"); a != b {
		t.Errorf("main.tf has %d lines, was %d", b, a)
	}
	if _, err := tmpl.Parse(files); err != nil {
		t.Fatalf("the files without buckets do not parse: %v", err)
	}
	// Nothing to remove: the files stay as they are.
	c2 := parseFiles(t, map[string]string{"main.tf": `resource "terraform_data" "box" {}`})
	if err := c2.RemoveBuckets(); err != nil || string(c2.Files()["main.tf"]) != `resource "terraform_data" "box" {}` {
		t.Fatalf("RemoveBuckets of a template without buckets: %v %q", err, c2.Files()["main.tf"])
	}
	// A data source of the type is no claim: the policy refuses it.
	wantRefused(t, checkPolicy(t, map[string]string{"d.tf": `data "kloud_bucket" "x" {}`}, testPolicy),
		refusal{rule: tmpl.RuleProvider, construct: `data "kloud_bucket"`, pos: "d.tf:1"})
}

// Every refusal names the file and line and says what is wrong.
func TestBucketsRefused(t *testing.T) {
	many := ""
	for i := range tmpl.MaxBuckets + 1 {
		many += fmt.Sprintf("resource \"kloud_bucket\" \"b%d\" {}\n", i)
	}
	for _, tc := range []struct {
		name, src, want string
	}{
		{"label upper", `resource "kloud_bucket" "Cache" {}`, `main.tf:1: resource "kloud_bucket" "Cache": a bucket's name is 1 to 30`},
		{"label underscore", `resource "kloud_bucket" "my_cache" {}`, "a bucket's name is"},
		{"label long", `resource "kloud_bucket" "` + strings.Repeat("a", 31) + `" {}`, "1 to 30"},
		{"label dash end", `resource "kloud_bucket" "cache-" {}`, "not ending with '-'"},
		{"retain expr", "resource \"kloud_bucket\" \"c\" {\n  retain = var.x\n}", "main.tf:2: resource \"kloud_bucket\" \"c\": retain must be true or false"},
		{"retain string", "resource \"kloud_bucket\" \"c\" {\n  retain = \"yes\"\n}", "retain must be true or false"},
		{"size zero", "resource \"kloud_bucket\" \"c\" {\n  max_size_mb = 0\n}", "max_size_mb must be a positive whole number"},
		{"size fraction", "resource \"kloud_bucket\" \"c\" {\n  max_size_mb = 1.5\n}", "max_size_mb must be"},
		{"provider ref", "resource \"kloud_bucket\" \"c\" {\n  provider = kloudlocal\n}", "provider must be a provider's name in quotes"},
		{"unknown arg", "resource \"kloud_bucket\" \"c\" {\n\n  count = 2\n}", `main.tf:3: resource "kloud_bucket" "c": argument "count": a bucket takes only`},
		{"nested block", "resource \"kloud_bucket\" \"c\" {\n  lifecycle {}\n}", `main.tf:2: resource "kloud_bucket" "c": block "lifecycle"`},
		{"too many", many, fmt.Sprintf("main.tf:%d: a template declares at most %d buckets", tmpl.MaxBuckets+1, tmpl.MaxBuckets)},
		{"reference", "resource \"kloud_bucket\" \"c\" {}\nresource \"terraform_data\" \"m\" {\n  input = kloud_bucket.c.id\n}", `main.tf:3: resource "terraform_data" "m": input refers to a kloud_bucket`},
		{"depends_on", "resource \"kloud_bucket\" \"c\" {}\nresource \"terraform_data\" \"m\" {\n  depends_on = [kloud_bucket.c]\n}", "depends_on refers to a kloud_bucket"},
		{"output", "resource \"kloud_bucket\" \"c\" {}\noutput \"o\" {\n  value = \"${kloud_bucket.c.name}\"\n}", `main.tf:3: output "o": value refers to a kloud_bucket`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseFiles(t, map[string]string{"main.tf": tc.src})
			_, err := c.Buckets()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Buckets: %v\nwant an error containing %q", err, tc.want)
			}
		})
	}
	// JSON: a reference in a string template.
	c := parseFiles(t, map[string]string{"m.tf.json": `{"resource": {"kloud_bucket": {"c": {}}, "terraform_data": {"m": {"input": "${kloud_bucket.c.id}"}}}}`})
	if _, err := c.Buckets(); err == nil || !strings.Contains(err.Error(), "m.tf.json:1: resource \"terraform_data\" \"m\": input refers to a kloud_bucket") {
		t.Fatalf("JSON reference: %v", err)
	}
}
