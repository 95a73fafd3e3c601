package tmpl_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/tmpl"
)

const paramsHCL = `variable "size" {
  type        = string
  description = "How big the machine is"
  default     = "small"
}

variable "cpus" {
  type    = number
  default = 2
  validation {
    condition     = var.cpus >= 1 && var.cpus <= 8
    error_message = "The machine has 1 to 8 CPUs."
  }
}

variable "repo" {
  type = string
  validation {
    condition     = can(regex("^https://", var.repo)) && startswith(var.repo, "https://git")
    error_message = "The repository is cloned over https from a git host."
  }
}

variable "tags" {
  type    = list(string)
  default = []
  validation {
    condition     = alltrue([for t in var.tags : length(t) <= 5])
    error_message = "Tags are at most 5 characters."
  }
}

variable "dotfiles" {
  type    = bool
  default = true
}

variable "token" {
  type      = string
  sensitive = true
  default   = "s3cret"
}

variable "odd" {
  type    = string
  default = "x"
  validation {
    condition     = sha256(var.odd) != ""
    error_message = "never shown by kloud: sha256 is Terraform's"
  }
}

kloud_parameter "size" {
  display_name = "Machine size"
  choices      = ["small", "large"]
  mutable      = false
  order        = 1
}

kloud_parameter "repo" {
  order = 2
}

kloud_preset "big" {
  default = true
  values  = { size = "large", cpus = 8 }
}

kloud_preset "tiny" {
  description = "the least"
  values      = { size = "small", cpus = 1, tags = ["a"] }
}

resource "terraform_data" "box" {
  input = {
    size = var.size
    cpus = var.cpus
    tags = var.tags
  }
}

output "cpus_plus_one" { value = var.cpus + 1 }
output "tags" { value = var.tags }
output "size" { value = var.size }
output "dotfiles" { value = var.dotfiles }
`

func paramsOf(t *testing.T, src string) *tmpl.Params {
	t.Helper()
	ps, err := parseFiles(t, map[string]string{"main.tf": src}).Params(nil)
	if err != nil {
		t.Fatalf("Params: %v", err)
	}
	return ps
}

func TestParams(t *testing.T) {
	ps := paramsOf(t, paramsHCL)
	var names []string
	for _, p := range ps.Parameters {
		names = append(names, p.Name)
	}
	if got := strings.Join(names, ","); got != "size,repo,cpus,tags,dotfiles,token,odd" {
		t.Errorf("order: %s", got)
	}
	size, _ := ps.Param("size")
	if size.DisplayName != "Machine size" || size.Mutable || size.Type != "string" || string(size.Default) != `"small"` || size.Required ||
		len(size.Choices) != 2 || string(size.Choices[1]) != `"large"` || size.Description != "How big the machine is" || size.Line != 1 {
		t.Errorf("size: %+v", size)
	}
	tags, _ := ps.Param("tags")
	if tags.Type != "list(string)" || string(tags.Default) != "[]" || len(tags.Validations) != 1 || tags.Validations[0].ErrorMessage != "Tags are at most 5 characters." {
		t.Errorf("tags: %+v", tags)
	}
	repo, _ := ps.Param("repo")
	if !repo.Required || !repo.Mutable {
		t.Errorf("repo: %+v", repo)
	}
	token, _ := ps.Param("token")
	if !token.Sensitive || token.Default != nil {
		t.Errorf("token: the sensitive default is shown: %+v", token)
	}
	if len(ps.Presets) != 2 || !ps.Presets[0].Default || string(ps.Presets[0].Values["cpus"]) != "8" || ps.Preset("").Name != "big" {
		t.Errorf("presets: %+v", ps.Presets)
	}
	b, _ := json.Marshal(ps)
	for _, want := range []string{`"displayName":"Machine size"`, `"errorMessage":`, `"required":true`, `"mutable":false`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s: %s", want, b)
		}
	}
}

func TestParamsResolve(t *testing.T) {
	ps := paramsOf(t, paramsHCL)
	none := ""
	tiny := "tiny"
	repo := json.RawMessage(`"https://git.example.com/a"`)
	cases := []struct {
		name    string
		in      tmpl.Input
		want    map[string]string // nil: refused
		errName string
		errMsg  string
	}{
		{"default preset", tmpl.Input{Values: map[string]json.RawMessage{"repo": repo}},
			map[string]string{"size": "large", "cpus": "8", "repo": "https://git.example.com/a"}, "", ""},
		{"no preset", tmpl.Input{Preset: &none, Values: map[string]json.RawMessage{"repo": repo, "tags": json.RawMessage(`["x","y"]`)}},
			map[string]string{"repo": "https://git.example.com/a", "tags": `["x","y"]`}, "", ""},
		{"explicit over preset", tmpl.Input{Preset: &tiny, Values: map[string]json.RawMessage{"repo": repo, "cpus": json.RawMessage(`4`)}},
			map[string]string{"size": "small", "cpus": "4", "tags": `["a"]`, "repo": "https://git.example.com/a"}, "", ""},
		{"strings", tmpl.Input{Preset: &none, Strings: map[string]string{"repo": "https://git.x/y", "cpus": "3", "tags": `["q"]`, "other": "kept"}},
			map[string]string{"repo": "https://git.x/y", "cpus": "3", "tags": `["q"]`, "other": "kept"}, "", ""},
		{"number from a JSON string", tmpl.Input{Values: map[string]json.RawMessage{"repo": repo, "cpus": json.RawMessage(`"5"`)}},
			map[string]string{"size": "large", "cpus": "5", "repo": "https://git.example.com/a"}, "", ""},
		{"validation", tmpl.Input{Values: map[string]json.RawMessage{"repo": repo, "cpus": json.RawMessage(`9`)}}, nil, "cpus", "The machine has 1 to 8 CPUs."},
		{"can(regex())", tmpl.Input{Values: map[string]json.RawMessage{"repo": json.RawMessage(`"ftp://x"`)}}, nil, "repo", "The repository is cloned over https from a git host."},
		{"for expression", tmpl.Input{Values: map[string]json.RawMessage{"repo": repo, "tags": json.RawMessage(`["toolong"]`)}}, nil, "tags", "Tags are at most 5 characters."},
		{"choices", tmpl.Input{Values: map[string]json.RawMessage{"repo": repo, "size": json.RawMessage(`"huge"`)}}, nil, "size", `"huge" is not one of the choices: "small", "large"`},
		{"type", tmpl.Input{Values: map[string]json.RawMessage{"repo": repo, "cpus": json.RawMessage(`"many"`)}}, nil, "cpus", "a number is needed"},
		{"unknown", tmpl.Input{Values: map[string]json.RawMessage{"repo": repo, "colour": json.RawMessage(`"red"`)}}, nil, "colour", "no such parameter"},
		{"required", tmpl.Input{}, nil, "repo", "a value is required"},
		{"unknown function left to terraform", tmpl.Input{Values: map[string]json.RawMessage{"repo": repo, "odd": json.RawMessage(`"y"`)}},
			map[string]string{"size": "large", "cpus": "8", "repo": "https://git.example.com/a", "odd": "y"}, "", ""},
		{"null", tmpl.Input{Values: map[string]json.RawMessage{"repo": json.RawMessage(`null`)}}, nil, "repo", "leave the parameter out"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ps.Resolve(tc.in)
			if tc.want == nil {
				var pe *tmpl.ParamError
				if !errors.As(err, &pe) || pe.Name != tc.errName || !strings.Contains(pe.Message, tc.errMsg) {
					t.Fatalf("want parameter %q refused with %q, got %v (%#v)", tc.errName, tc.errMsg, err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
	nope := "nope"
	if _, err := ps.Resolve(tmpl.Input{Preset: &nope}); err == nil || !strings.Contains(err.Error(), `no preset "nope"`) {
		t.Errorf("unknown preset: %v", err)
	}
}

func TestParamsRefused(t *testing.T) {
	base := "variable \"size\" {\n  type = string\n  default = \"s\"\n}\n"
	cases := []struct{ name, src, want string }{
		{"unknown key", base + "kloud_parameter \"size\" {\n  colour = \"red\"\n}\n", `main.tf:6: kloud_parameter "size": argument "colour"`},
		{"no variable", base + "kloud_parameter \"sise\" {\n  order = 1\n}\n", `main.tf:5: kloud_parameter "sise": the template declares no variable "sise"`},
		{"choice of the wrong type", "variable \"n\" {\n  type = number\n  default = 1\n}\nkloud_parameter \"n\" {\n  choices = [1, \"x\"]\n}\n", `main.tf:6: kloud_parameter "n": choice "x"`},
		{"default not a choice", base + "kloud_parameter \"size\" {\n  choices = [\"a\"]\n}\n", `main.tf:5: kloud_parameter "size": the variable's default "s" is not one of the choices`},
		{"not literal", base + "kloud_parameter \"size\" {\n  display_name = var.size\n}\n", `main.tf:6: kloud_parameter "size": display_name must be a literal value`},
		{"two defaults", base + "kloud_preset \"a\" {\n  default = true\n  values = {}\n}\nkloud_preset \"b\" {\n  default = true\n  values = {}\n}\n", `main.tf:9: kloud_preset "b": preset "a" is the default already`},
		{"preset value invalid", "variable \"n\" {\n  type = number\n  validation {\n    condition = var.n < 3\n    error_message = \"Small.\"\n  }\n}\nkloud_preset \"p\" {\n  values = { n = \"x\" }\n}\n", `main.tf:9: kloud_preset "p": values: a number is needed`},
		{"preset names no parameter", base + "kloud_preset \"p\" {\n  values = { colour = 1 }\n}\n", `main.tf:6: kloud_preset "p": values: the template has no parameter "colour"`},
		{"preset key", base + "kloud_preset \"p\" {\n  value = { size = \"x\" }\n}\n", `main.tf:6: kloud_preset "p": argument "value"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFiles(t, map[string]string{"main.tf": tc.src}).Params(nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want %q, got %v", tc.want, err)
			}
		})
	}
}

// TestParamsJSONSyntax reads the blocks from a .tf.json template.
func TestParamsJSONSyntax(t *testing.T) {
	src := `{
  "variable": {"n": {"type": "number", "default": 1, "validation": [{"condition": "${var.n < 5}", "error_message": "Under five."}]}},
  "kloud_parameter": {"n": {"display_name": "N", "order": 3}},
  "kloud_preset": {"four": {"values": {"n": 4}}},
  "resource": {"terraform_data": {"x": {"input": "${var.n}"}}}
}`
	c := parseFiles(t, map[string]string{"main.tf.json": src})
	ps, err := c.Params(nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := ps.Param("n"); p.DisplayName != "N" || p.Type != "number" || p.Order != 3 {
		t.Errorf("n: %+v", p)
	}
	if _, err := ps.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"n": json.RawMessage("7")}}); err == nil || !strings.Contains(err.Error(), "Under five.") {
		t.Errorf("validation: %v", err)
	}
	if err := c.RemoveParams(); err != nil {
		t.Fatal(err)
	}
	if s := string(c.Files()["main.tf.json"]); strings.Contains(s, "kloud_") {
		t.Errorf("not removed: %s", s)
	}
}

// TestParamsTerraform checks with the real terraform: the files without kloud's blocks apply;
// typed values reach it typed (a number stays a number, a list a list); and for a value kloud
// refuses, terraform's own message is kloud's.
func TestParamsTerraform(t *testing.T) {
	c := parseFiles(t, map[string]string{"main.tf": paramsHCL})
	ps, err := c.Params(nil)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := ps.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"repo": json.RawMessage(`"https://git.x/r"`), "tags": json.RawMessage(`["a","b"]`), "cpus": json.RawMessage("3")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveParams(); err != nil {
		t.Fatal(err)
	}
	files := c.Files()
	if strings.Contains(string(files["main.tf"]), "kloud_p") && !strings.Contains(string(files["main.tf"]), "# kloud_parameter/kloud_preset") {
		t.Fatalf("blocks left: %s", files["main.tf"])
	}
	typed := map[string]any{}
	for k, v := range vals {
		if typed[k], err = c.TypedValue(k, v); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	writeFiles(t, dir, files)
	b, _ := json.Marshal(typed)
	if err := os.WriteFile(filepath.Join(dir, "kloud.auto.tfvars.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tf := newTerraform(t, dir)
	tf.run("init", "-input=false")
	tf.run("apply", "-input=false", "-auto-approve")
	var out map[string]struct {
		Value any `json:"value"`
		Type  any `json:"type"`
	}
	if err := json.Unmarshal([]byte(tf.run("output", "-json")), &out); err != nil {
		t.Fatal(err)
	}
	if out["cpus_plus_one"].Value != 4.0 || out["size"].Value != "large" || out["dotfiles"].Value != true {
		t.Errorf("outputs: %+v", out)
	}
	if tags, ok := out["tags"].Value.([]any); !ok || len(tags) != 2 || tags[1] != "b" {
		t.Errorf("tags reached terraform as %#v", out["tags"].Value)
	}

	// The same refusal from terraform and from kloud.
	for name, bad := range map[string]string{"cpus": "9", "repo": `"ftp://x"`, "tags": `["toolong"]`} {
		_, kerr := ps.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"repo": json.RawMessage(`"https://git.x/r"`), name: json.RawMessage(bad)}})
		var pe *tmpl.ParamError
		if !errors.As(kerr, &pe) || pe.Name != name {
			t.Fatalf("%s=%s: kloud did not refuse it: %v", name, bad, kerr)
		}
		tv, _ := c.TypedValue(name, strings.Trim(bad, `"`))
		vb, _ := json.Marshal(map[string]any{"repo": "https://git.x/r", name: tv})
		if err := os.WriteFile(filepath.Join(dir, "kloud.auto.tfvars.json"), vb, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(tf.bin, "plan", "-input=false", "-no-color")
		cmd.Dir, cmd.Env = dir, tf.env
		msg, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("%s=%s: terraform accepted it", name, bad)
		}
		if flat := strings.Join(strings.Fields(string(msg)), " "); !strings.Contains(flat, pe.Message) {
			t.Errorf("%s: kloud says %q; terraform:\n%s", name, pe.Message, msg)
		}
	}
}

// TestParamsHostile: what a team member could write to hurt kloud, or a caller to read a
// secret, is not evaluated or not echoed: a condition building a huge list is left to
// Terraform; a refused sensitive value is not quoted, nor is an error_message that would
// interpolate it; an untyped variable takes strings only.
func TestParamsHostile(t *testing.T) {
	ps := paramsOf(t, `variable "n" {
  type = number
  validation {
    condition     = length(range(100000000)) > var.n
    error_message = "never evaluated by kloud"
  }
}
variable "secret" {
  type      = string
  sensitive = true
  validation {
    condition     = length(var.secret) > 8
    error_message = "too short: ${var.secret}"
  }
}
variable "pick" {
  type      = string
  sensitive = true
  default   = "a"
}
kloud_parameter "pick" {
  choices = ["a", "b"]
}
variable "untyped" {
  default = ["x"]
}
`)
	if _, err := ps.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"n": json.RawMessage("1"), "secret": json.RawMessage(`"long-enough-secret"`)}}); err != nil {
		t.Fatalf("a condition calling range is Terraform's to check: %v", err)
	}
	_, err := ps.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"n": json.RawMessage("1"), "secret": json.RawMessage(`"hunter2"`)}})
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), `too short: ${var.secret}`) {
		t.Fatalf("a sensitive value refused by its validation: %v", err)
	}
	_, err = ps.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"n": json.RawMessage("1"), "secret": json.RawMessage(`"long-enough-secret"`), "pick": json.RawMessage(`"zzz-secret"`)}})
	if err == nil || strings.Contains(err.Error(), "zzz-secret") || !strings.Contains(err.Error(), "not one of the choices") {
		t.Fatalf("a sensitive value not among the choices: %v", err)
	}
	_, err = ps.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"n": json.RawMessage("1"), "secret": json.RawMessage(`"long-enough-secret"`), "untyped": json.RawMessage(`["y"]`)}})
	if err == nil || !strings.Contains(err.Error(), `parameter "untyped": a string is needed`) {
		t.Fatalf("a list for an untyped variable: %v", err)
	}

	// Work beyond linear in the values a stack's creator sends is Terraform's to do (in its
	// sandbox), never kloud's: loops in loops always (in the condition, or a for directive in
	// the message of a condition that loops), one loop or distinct over values beyond 200
	// elements or 256 bytes of text. Each condition is false for the values below, so a refusal means kloud evaluated it.
	costly := paramsOf(t, `variable "l" {
  type    = list(string)
  default = []
  validation {
    condition     = length([for a in var.l : [for b in var.l : a]]) == 0
    error_message = "nested: never evaluated by kloud"
  }
  validation {
    condition     = length([for a in var.l : a]) > 0 && length(var.l) == 0
    error_message = "%{for a in var.l}${join(",", var.l)}%{endfor}"
  }
}
variable "m" {
  type = list(string)
  default = ["a"]
  validation {
    condition     = length([for a in var.m : a if contains(var.m, a)]) == 0
    error_message = "one loop"
  }
  validation {
    condition     = length(distinct(var.m)) == 0
    error_message = "distinct"
  }
}
`)
	if _, err := costly.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"l": json.RawMessage(`["a", "b"]`)}}); err != nil {
		t.Fatalf("conditions with loops in loops are Terraform's to check: %v", err)
	}
	// Nothing of the host: kloud has no function that reads a file or the environment, so a
	// condition calling one is Terraform's (in its sandbox) and kloud reads nothing.
	host := paramsOf(t, `variable "s" {
  type = string
  validation {
    condition     = length(file("/proc/self/environ")) == 0 && length(templatefile("/etc/hostname", {})) == 0
    error_message = "kloud read a file of its host"
  }
}
`)
	if _, err := host.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"s": json.RawMessage(`"x"`)}}); err != nil {
		t.Fatalf("a condition reading host files: %v", err)
	}
	for _, name := range []string{"file", "templatefile", "fileexists", "filebase64", "env", "pathexpand"} {
		if _, ok := tmpl.Functions()[name]; ok {
			t.Errorf("kloud evaluates conditions with %s, which reaches its host", name)
		}
	}
	// One loop, and distinct, over small values: kloud checks them.
	_, err = costly.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"m": json.RawMessage(`["a", "b"]`)}})
	if err == nil || !strings.Contains(err.Error(), "one loop") {
		t.Fatalf("one loop over a small list: %v", err)
	}
	// Over a list of 2,000 items: Terraform's.
	big := make([]string, 2000)
	for i := range big {
		big[i] = `"x"`
	}
	if _, err := costly.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"m": json.RawMessage("[" + strings.Join(big, ",") + "]")}}); err != nil {
		t.Fatalf("a loop and distinct over 2,000 items are Terraform's to check: %v", err)
	}
	if _, err := costly.Resolve(tmpl.Input{Values: map[string]json.RawMessage{"m": json.RawMessage(`["` + strings.Repeat("y", 1<<10) + `"]`)}}); err != nil {
		t.Fatalf("a loop over 1 KiB of text is Terraform's to check: %v", err)
	}
}
