package tmpl_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

// testPolicy is what kloud offers with the local and dummy providers registered.
var testPolicy = tmpl.Policy{Providers: []tmpl.AllowedProvider{
	{Name: "kloudlocal", Source: "kloud/kloudlocal"},
	{Name: "terraform", Types: []string{"terraform_data"}},
}}

func checkPolicy(t *testing.T, files map[string]string, p tmpl.Policy) error {
	t.Helper()
	return parseFiles(t, files).CheckPolicy(p) // bucket_test.go
}

type refusal struct {
	rule      string
	construct string // substring of the construct
	pos       string // file:line:col prefix, or file:line
}

func wantRefused(t *testing.T, err error, want ...refusal) {
	t.Helper()
	if err == nil {
		t.Fatalf("policy accepted the template; want %v", want)
	}
	var got []*tmpl.PolicyError
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var pe *tmpl.PolicyError
		if !errors.As(e, &pe) {
			t.Fatalf("not a *PolicyError: %v", e)
		}
		got = append(got, pe)
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			pos := fmt.Sprintf("%s:%d:%d", g.File, g.Line, g.Column)
			if g.Rule == w.rule && strings.Contains(g.Construct, w.construct) && strings.HasPrefix(pos+":", w.pos+":") {
				found = true
			}
		}
		if !found {
			t.Errorf("want %s refused at %s (rule %s); got:\n%v", w.construct, w.pos, w.rule, err)
		}
	}
	if !strings.Contains(err.Error(), "is not allowed (rule ") {
		t.Errorf("message does not say the rule: %v", err)
	}
}

func TestPolicyRefuses(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  []refusal
	}{
		// provisioners and connections
		{"local-exec", map[string]string{"main.tf": `resource "terraform_data" "x" {
  provisioner "local-exec" { command = "id > /tmp/pwned" }
}
`}, []refusal{{"provisioner", `provisioner "local-exec"`, "main.tf:2:3"}}},
		{"local-exec json", map[string]string{"main.tf.json": `{
  "resource": {"terraform_data": {"x": {
    "provisioner": [{"local-exec": {"command": "id > /tmp/pwned"}}]
  }}}
}`}, []refusal{{"provisioner", `provisioner "local-exec"`, "main.tf.json:3"}}},
		{"remote-exec and connection", map[string]string{"main.tf": `resource "kloudlocal_machine" "x" {
  connection {
    host = "10.0.0.1"
  }
  provisioner "remote-exec" {
    inline = ["true"]
  }
  provisioner "file" {
    source      = "/etc/shadow"
    destination = "/tmp/x"
  }
}
`}, []refusal{{"provisioner", "connection", "main.tf:2:3"}, {"provisioner", `provisioner "remote-exec"`, "main.tf:5:3"}, {"provisioner", `provisioner "file"`, "main.tf:8:3"}}},
		{"provisioner in data and removed", map[string]string{"main.tf": `data "kloudlocal_machine" "x" {
  provisioner "local-exec" { command = "true" }
}
removed {
  from = terraform_data.old
  provisioner "local-exec" {
    when    = destroy
    command = "true"
  }
}
`}, []refusal{{"provisioner", "local-exec", "main.tf:2:3"}, {"provisioner", "local-exec", "main.tf:6:3"}}},
		{"provisioner in removed json", map[string]string{"a.tf.json": `{"removed": [{"from": "terraform_data.old",
  "provisioner": {"local-exec": {"when": "destroy", "command": "true"}}}]}`},
			[]refusal{{"provisioner", "local-exec", "a.tf.json:2"}}},

		// host functions and paths
		{"file in user data", map[string]string{"main.tf": `resource "kloudlocal_machine" "x" {
  user_data = file("/var/lib/kloud/secret")
}
`}, []refusal{{"host-function", "function file", "main.tf:2:15"}}},
		{"file in json template", map[string]string{"main.tf.json": `{"resource": {"kloudlocal_machine": {"x": {
  "user_data": "#!/bin/sh\necho ${file(\"/etc/shadow\")}"
}}}}`}, []refusal{{"host-function", "function file", "main.tf.json:2:16"}}},
		{"host functions everywhere", map[string]string{"main.tf": `locals {
  a = templatefile("x.tpl", {})
  b = [for f in fileset("/", "*") : filebase64(f)]
}
variable "v" {
  type = list(string)
  validation {
    condition     = fileexists("/root/.ssh/id_rsa")
    error_message = "x"
  }
}
output "o" {
  value = sha256(filemd5("/etc/passwd"))
  precondition {
    condition     = abspath(".") != pathexpand("~")
    error_message = "${filesha512("/x")}"
  }
}
resource "terraform_data" "d" {
  dynamic "x" {
    for_each = toset([filesha1("/x")])
    content {}
  }
  input = templatestring(local.a, {})
}
`}, []refusal{
			{"host-function", "templatefile", "main.tf:2:7"}, {"host-function", "fileset", "main.tf:3:17"},
			{"host-function", "filebase64", "main.tf:3:37"}, {"host-function", "fileexists", "main.tf:8:21"},
			{"host-function", "filemd5", "main.tf:13:18"}, {"host-function", "abspath", "main.tf:15:21"},
			{"host-function", "pathexpand", "main.tf:15:37"}, {"host-function", "filesha512", "main.tf:16:24"},
			{"host-function", "filesha1", "main.tf:21:23"}, {"host-function", "templatestring", "main.tf:24:11"},
		}},
		{"path references", map[string]string{"main.tf": `output "where" {
  value = "${path.module} ${path.root} ${path.cwd}"
}
`}, []refusal{{"host-function", "path.module", "main.tf:2:14"}, {"host-function", "path.root", "main.tf:2:29"}, {"host-function", "path.cwd", "main.tf:2:42"}}},
		{"path reference json", map[string]string{"o.tf.json": `{"output": {"where": {"value": "${path.cwd}"}}}`},
			[]refusal{{"host-function", "path.cwd", "o.tf.json:1:32"}}},
		{"unknown and provider functions", map[string]string{"main.tf": `locals {
  a = frobnicate(1)
  b = provider::aws::arn_parse("x")
}
`}, []refusal{{"function", "frobnicate", "main.tf:2:7"}, {"provider", "provider::aws::arn_parse", "main.tf:3:7"}}},
		{"function in json key", map[string]string{"k.tf.json": `{"locals": {"a": {"${file(\"/x\")}": 1}}}`},
			[]refusal{{"host-function", "function file", "k.tf.json:1"}}},

		// providers kloud does not offer
		{"local_file resource", map[string]string{"main.tf": `resource "local_file" "x" {
  filename = "/etc/cron.d/pwn"
  content  = "* * * * * root id"
}
`}, []refusal{{"provider", `resource "local_file" "x"`, "main.tf:1:10"}}},
		{"local_file json", map[string]string{"main.tf.json": `{"resource": [{"local_file": {"x": {"filename": "/etc/x", "content": "y"}}}]}`},
			[]refusal{{"provider", `resource "local_file" "x"`, "main.tf.json:1"}}},
		{"http and external data", map[string]string{"main.tf": `data "http" "x" {
  url = "http://169.254.169.254/"
}
data "external" "y" {
  program = ["sh", "-c", "id"]
}
`}, []refusal{{"provider", `data "http" "x"`, "main.tf:1:6"}, {"provider", `data "external" "y"`, "main.tf:4:6"}}},
		{"external json", map[string]string{"d.tf.json": `{"data": {"external": {"y": {"program": ["sh", "-c", "id"]}}}}`},
			[]refusal{{"provider", `data "external" "y"`, "d.tf.json:1"}}},
		{"remote state", map[string]string{"main.tf": `data "terraform_remote_state" "other" {
  backend = "local"
  config = { path = "/var/lib/kloud/terraformer/other/terraform.tfstate" }
}
`}, []refusal{{"provider", "terraform_remote_state", "main.tf:1:6"}}},
		{"null_resource", map[string]string{"main.tf": `resource "null_resource" "x" {}
`}, []refusal{{"provider", "null_resource", "main.tf:1:10"}}},
		{"data source in check", map[string]string{"main.tf": `check "c" {
  data "http" "x" { url = "http://127.0.0.1:8080/" }
  assert {
    condition     = true
    error_message = "x"
  }
}
`}, []refusal{{"provider", `data "http" "x"`, "main.tf:2:8"}}},
		{"data source in check json", map[string]string{"c.tf.json": `{"check": {"c": {"data": {"http": {"x": {"url": "http://127.0.0.1/"}}}, "assert": [{"condition": true, "error_message": "x"}]}}}`},
			[]refusal{{"provider", `data "http" "x"`, "c.tf.json:1"}}},
		{"required_providers", map[string]string{"main.tf": `terraform {
  required_providers {
    local      = { source = "hashicorp/local" }
    kloudlocal = { source = "evil/kloudlocal" }
  }
}
`}, []refusal{{"provider", `required_providers entry "local"`, "main.tf:3:5"}, {"provider", `required_providers entry "kloudlocal"`, "main.tf:4:18"}}},
		{"provider blocks", map[string]string{"main.tf": `provider "kloudlocal" {
  state_dir = "/root"
}
provider "local" {}
resource "kloudlocal_machine" "x" {
  provider = local.other
}
`}, []refusal{{"provider", `provider "kloudlocal" argument state_dir`, "main.tf:2:3"}, {"provider", `provider "local"`, "main.tf:4:1"}, {"provider", "provider argument", "main.tf:6:14"}}},
		{"provider block json", map[string]string{"p.tf.json": `{"provider": {"kloudlocal": {"endpoint": "http://evil"}}}`},
			[]refusal{{"provider", "argument endpoint", "p.tf.json:1"}}},

		// backends, modules, other blocks
		{"backend local", map[string]string{"main.tf": `terraform {
  backend "local" {
    path = "/var/lib/kloud/stolen.tfstate"
  }
}
`}, []refusal{{"backend", "terraform backend", "main.tf:2:3"}}},
		{"backend json and cloud", map[string]string{"b.tf.json": `{"terraform": {"backend": {"local": {"path": "/x"}}, "cloud": {"organization": "x"}}}`},
			[]refusal{{"backend", "terraform backend", "b.tf.json:1"}, {"backend", "terraform cloud", "b.tf.json:1"}}},
		{"module", map[string]string{"main.tf": `module "m" {
  source = "/var/lib/kloud"
}
`}, []refusal{{"module", `module "m"`, "main.tf:1:1"}}},
		{"module json", map[string]string{"m.tf.json": `{"module": {"m": {"source": "git::https://example.invalid/x"}}}`},
			[]refusal{{"module", `module "m"`, "m.tf.json:1"}}},
		{"other blocks", map[string]string{"main.tf": `terraform {
  provider_meta "kloudlocal" {}
  experiments = []
}
import {
  to = kloudlocal_machine.x
  id = "other-stacks-machine"
}
ephemeral "random_password" "p" {}
action "local_command" "a" {}
`}, []refusal{{"block", "terraform provider_meta", "main.tf:2:3"}, {"block", "terraform experiments", "main.tf:3:3"},
			{"block", "import block", "main.tf:5:1"}, {"block", "ephemeral", "main.tf:9:1"}, {"block", `block "action"`, "main.tf:10:1"}}},
		{"unknown block json", map[string]string{"u.tf.json": `{"action": {"local_command": {"a": {}}}, "//": "comments are fine"}`},
			[]refusal{{"block", `block "action"`, "u.tf.json:1"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantRefused(t, checkPolicy(t, tc.files, testPolicy), tc.want...)
		})
	}
}

// TestPolicyAllows: what kloud's own templates and tests use passes.
func TestPolicyAllows(t *testing.T) {
	cases := map[string]map[string]string{
		"demo": {"main.tf": `# Two machines on this host (local provider: Linux namespaces + real cloud-init).
terraform {
  required_providers {
    kloudlocal = { source = "kloud/kloudlocal" }
  }
}

resource "kloudlocal_machine" "dev" {
  count    = 2
  hostname = "dev-${count.index}"
  memory   = 512
  user_data = <<-EOT
    #!/bin/bash
    echo "Welcome to $(hostname), built by Kloud" > /etc/motd
  EOT
}
`},
		"dummy": {"main.tf": `variable "size" {
  type    = object({ path = string, n = optional(number, 1) })
  default = { path = "/srv" }
  validation {
    condition     = length(var.size.path) > 0
    error_message = "path is required"
  }
}
locals {
  tags = { path = "x", name = upper("web") }
}
resource "terraform_data" "vm" {
  count = 2
  input = <<-EOT
    echo hello from ${count.index} $${HOME}
  EOT
  lifecycle { ignore_changes = [input] }
}
moved {
  from = terraform_data.old
  to   = terraform_data.vm
}
removed {
  from = terraform_data.gone
  lifecycle { destroy = false }
}
check "c" {
  assert {
    condition     = jsonencode(local.tags) != ""
    error_message = "x"
  }
}
output "ids" { value = terraform_data.vm[*].id }
provider "kloudlocal" {}
terraform { required_version = ">= 1.5" }
`},
		"json": {"main.tf.json": `{
  "//": "a comment",
  "terraform": {"required_providers": {"kloudlocal": {"source": "registry.terraform.io/kloud/kloudlocal"}}},
  "variable": {"n": {"type": "list(string)", "default": []}},
  "resource": {"kloudlocal_machine": {"dev": {"count": 1, "hostname": "dev-${count.index}", "user_data": "#!/bin/sh\necho $${HOME}"}}},
  "output": {"x": {"value": "${jsonencode(kloudlocal_machine.dev[*].id)}"}}
}`},
	}
	for name, files := range cases {
		t.Run(name, func(t *testing.T) {
			if err := checkPolicy(t, files, testPolicy); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
}

// TestPolicyLift: a trusted template with a rule lifted passes that rule and no other.
func TestPolicyLift(t *testing.T) {
	files := map[string]string{"main.tf": `resource "terraform_data" "x" {
  input = file("/etc/hostname")
  provisioner "local-exec" { command = "true" }
}
`}
	p := testPolicy
	p.Lift = []string{tmpl.RuleProvisioner}
	err := checkPolicy(t, files, p)
	wantRefused(t, err, refusal{"host-function", "function file", "main.tf:2:11"})
	if strings.Contains(err.Error(), "rule provisioner") {
		t.Errorf("provisioner was lifted: %v", err)
	}
	p.Lift = []string{tmpl.RuleProvisioner, tmpl.RuleHostFunction}
	if err := checkPolicy(t, files, p); err != nil {
		t.Errorf("both rules lifted: %v", err)
	}
}

// TestPolicyNoProviders: with no provider offering terraform_data, it is refused too.
func TestPolicyNoProviders(t *testing.T) {
	err := checkPolicy(t, map[string]string{"main.tf": `resource "terraform_data" "x" {}
`}, tmpl.Policy{})
	wantRefused(t, err, refusal{"provider", "terraform_data", "main.tf:1:10"})
}
