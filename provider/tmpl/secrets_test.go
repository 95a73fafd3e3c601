package tmpl_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

var secrets = []string{"aws_access_key", "aws_secret_key"}

// secretCases are the files in testdata/secrets, each with the violations it must produce, as
// "line:col var in block > path".
var secretCases = map[string][]string{
	"ok.tf":       nil,
	"ok.tf.json":  nil,
	"resource.tf": {`3:15 aws_secret_key in resource "aws_instance" "web" > user_data`},
	"resource.tf.json": {`6:30 aws_secret_key in resource "aws_instance" "web" > user_data`,
		`8:27 aws_access_key in resource "aws_instance" "web" > tags`},
	"locals.tf":  {`2:10 aws_secret_key in locals > key`, `3:26 aws_access_key in locals > both`},
	"output.tf":  {`3:13 aws_access_key in output "key" > value`},
	"data.tf":    {`2:39 aws_secret_key in data "http" "leak" > url`},
	"module.tf":  {`3:12 aws_secret_key in module "net" > secret`},
	"default.tf": {`2:13 aws_secret_key in variable "copy" > default`},
	"provisioner.tf": {`4:23 aws_secret_key in resource "aws_instance" "web" > provisioner "local-exec" > command`,
		`9:16 aws_access_key in resource "aws_instance" "web" > connection > password`},
	"provisioner.tf.json": {`8:32 aws_secret_key in resource "aws_instance" "web" > provisioner`},
	"dynamic.tf": {`3:16 aws_secret_key in resource "aws_instance" "web" > dynamic "ebs_block_device" > for_each`,
		`5:21 aws_access_key in resource "aws_instance" "web" > dynamic "ebs_block_device" > content > device_name`},
	"meta.tf": {`2:18 aws_secret_key in resource "aws_instance" "a" > count`,
		`5:21 aws_access_key in resource "aws_instance" "b" > for_each`},
	"functions.tf": {`2:50 aws_secret_key in resource "aws_instance" "web" > user_data`,
		`3:27 aws_access_key in resource "aws_instance" "web" > tags`,
		`4:21 aws_secret_key in resource "aws_instance" "web" > ami`},
	"index.tf":  {`2:15 aws_secret_key in resource "aws_instance" "web" > user_data`},
	"nested.tf": {`4:18 aws_secret_key in resource "aws_instance" "web" > root_block_device > tags`},
	"check.tf":  {`3:21 aws_secret_key in check "c" > assert > condition`},
	"import.tf": {`2:8 aws_secret_key in import > id`},
	"toplevel.tf.json": {`4:13 aws_secret_key in locals > a`,
		`6:23 aws_access_key in top level > unknown_block`},
	"rootarray.tf.json":   {`3:58 aws_secret_key in resource "aws_instance" "web" > user_data`},
	"json_output.tf.json": {`1:38 aws_secret_key in output "o" > value`},
}

func TestCheckSecretRefs(t *testing.T) {
	ents, err := os.ReadDir("testdata/secrets")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(secretCases) {
		t.Errorf("testdata/secrets has %d files, secretCases %d", len(ents), len(secretCases))
	}
	for name, want := range secretCases {
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("testdata/secrets", name))
			if err != nil {
				t.Fatal(err)
			}
			c := mustParse(t, map[string][]byte{name: src})
			err = c.CheckSecretRefs(secrets)
			var got []string
			if err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					var se *tmpl.SecretRefError
					if !errors.As(e, &se) {
						t.Fatalf("%v is not a *SecretRefError", e)
					}
					if se.File != name {
						t.Errorf("File = %q", se.File)
					}
					where := se.Block
					if se.Path != "" {
						where += " > " + se.Path
					}
					got = append(got, fmt.Sprintf("%d:%d %s in %s", se.Line, se.Column, se.Var, where))
					if !strings.HasPrefix(e.Error(), fmt.Sprintf("%s:%d:%d: var.%s is a secret", name, se.Line, se.Column, se.Var)) {
						t.Errorf("message %q", e)
					}
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("violations\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if err := c.CheckSecretRefs(nil); err != nil {
				t.Errorf("no secrets: %v", err)
			}
		})
	}
}

func TestCheckSecretRefsAcrossFiles(t *testing.T) {
	c := mustParse(t, map[string][]byte{
		"b.tf":      []byte("provider \"aws\" {\n  secret_key = var.aws_secret_key\n}\n"),
		"a.tf":      []byte("locals {\n  k = var.aws_secret_key\n}\n"),
		"c.tf.json": []byte(`{"output": {"k": {"value": "${var.aws_access_key}"}}}`),
	})
	err := c.CheckSecretRefs(secrets)
	if err == nil {
		t.Fatal("no error")
	}
	want := "a.tf:2:7: var.aws_secret_key is a secret that only provider blocks may use; it is used in locals > k\n" +
		`c.tf.json:1:31: var.aws_access_key is a secret that only provider blocks may use; it is used in output "k" > value`
	if err.Error() != want {
		t.Errorf("error\n%s\nwant\n%s", err, want)
	}
}
