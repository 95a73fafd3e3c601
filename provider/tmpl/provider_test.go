package tmpl

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	hcljson "github.com/hashicorp/hcl/v2/json"
)

var testProvider = ProviderConfig{
	Name: "kloudtest", Source: "kloud/kloudtest", Version: "1.2.3", File: "kloud_test.tf.json",
	Comment: "generated", Args: map[string]string{"endpoint": EscapeTemplate("http://x/${y}"), "token": "${var.t}"},
}

func TestConfigureProvider(t *testing.T) {
	const machine = "resource \"kloudtest_machine\" \"a\" {\n  hostname = \"a\"\n}\n"
	src := "terraform {\n  required_providers {\n    kloudtest = { source = \"registry.terraform.io/kloud/kloudtest\" }\n  }\n}\n\nprovider \"kloudtest\" {\n\n}\n" + machine
	files, err := ConfigureProvider(map[string][]byte{"main.tf": []byte(src), "b.tf": []byte("# nothing of the provider\n")}, testProvider)
	if err != nil {
		t.Fatal(err)
	}
	got := string(files["main.tf"])
	if strings.Contains(got, `provider "kloudtest" {`) || !strings.Contains(got, `# provider "kloudtest": configured by kloud in kloud_test.tf.json`) ||
		strings.Count(got, "\n") != strings.Count(src, "\n") {
		t.Errorf("provider block not replaced line for line:\n%s", got)
	}
	if string(files["b.tf"]) != "# nothing of the provider\n" {
		t.Errorf("b.tf changed:\n%s", files["b.tf"])
	}
	var g map[string]any
	if err := json.Unmarshal(files[testProvider.File], &g); err != nil {
		t.Fatal(err)
	}
	p := g["provider"].(map[string]any)["kloudtest"].(map[string]any)
	if p["endpoint"] != "http://x/$${y}" || p["token"] != "${var.t}" || g["//"] != "generated" {
		t.Errorf("generated: %v", g)
	}
	if _, ok := g["terraform"]; ok {
		t.Errorf("required_providers declared twice: %v", g)
	}
	if _, err := Parse(files); err != nil {
		t.Errorf("result does not parse: %s", err)
	}

	files, err = ConfigureProvider(map[string][]byte{"main.tf.json": []byte(`{"provider": {"kloudtest": {}}}`)}, testProvider)
	if err != nil {
		t.Fatal(err)
	}
	if string(files["main.tf.json"]) != "{}\n" {
		t.Errorf("JSON provider after removal: %s", files["main.tf.json"])
	}
	if err := json.Unmarshal(files[testProvider.File], &g); err != nil || g["terraform"] == nil {
		t.Errorf("required_providers not declared: %s (%v)", files[testProvider.File], err)
	}

	for _, bad := range []string{`provider "kloudtest" { endpoint = "x" }`, "terraform {\n  required_providers {\n    kloudtest = { source = \"other/kloudtest\" }\n  }\n}"} {
		if _, err := ConfigureProvider(map[string][]byte{"main.tf": []byte(bad)}, testProvider); err == nil || !strings.Contains(err.Error(), "main.tf:") {
			t.Errorf("%s: %v, want an error naming main.tf", bad, err)
		}
	}
}

func TestDeclareProviders(t *testing.T) {
	offered := []AllowedProvider{
		{Name: "terraform", Types: []string{"terraform_data"}},
		{Name: "kloudtest", Source: "kloud/kloudtest"},
		{Name: "other", Source: "kloud/other"},
	}
	// declared returns the required_providers entries of DeclaredFile (nil without the file).
	declared := func(t *testing.T, files map[string][]byte) map[string]map[string]string {
		t.Helper()
		src, ok := files[DeclaredFile]
		if !ok {
			return nil
		}
		if _, diags := hcljson.Parse(src, DeclaredFile); diags.HasErrors() {
			t.Fatalf("%s is not a .tf.json file: %s\n%s", DeclaredFile, diags, src)
		}
		var g struct {
			Terraform struct {
				RequiredProviders map[string]map[string]string `json:"required_providers"`
			} `json:"terraform"`
		}
		if err := json.Unmarshal(src, &g); err != nil {
			t.Fatal(err)
		}
		return g.Terraform.RequiredProviders
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  map[string]map[string]string // nil: no DeclaredFile
	}{
		{
			name:  "undeclared",
			files: map[string]string{"main.tf": "provider \"kloudtest\" {}\n\nresource \"kloudtest_machine\" \"a\" {\n  count = 2\n}\n"},
			want:  map[string]map[string]string{"kloudtest": {"source": "kloud/kloudtest"}},
		},
		{
			name: "declared with the registry host, in other case",
			files: map[string]string{
				"main.tf":     "resource \"kloudtest_machine\" \"a\" {}\n",
				"versions.tf": "terraform {\n  required_providers {\n    kloudtest = { source = \"Registry.Terraform.io/Kloud/KloudTest\" }\n  }\n}\n",
			},
		},
		{
			name: "one declared in JSON, one used by a meta-argument only",
			files: map[string]string{
				"a.tf.json": `{"terraform": {"required_providers": {"kloudtest": {"source": "kloud/kloudtest", "version": "1.2.3"}}}, "resource": {"kloudtest_machine": {"a": {}}}}`,
				"b.tf":      "resource \"kloudtest_machine\" \"b\" {\n  provider = other.alias\n}\n",
			},
			want: map[string]map[string]string{"other": {"source": "kloud/other"}},
		},
		{
			name:  "built-in, and a provider kloud does not offer",
			files: map[string]string{"main.tf": "resource \"terraform_data\" \"a\" {}\nresource \"aws_instance\" \"b\" {}\n"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := map[string][]byte{}
			for n, s := range tc.files {
				in[n] = []byte(s)
			}
			out, err := DeclareProviders(in, offered)
			if err != nil {
				t.Fatal(err)
			}
			for n, s := range tc.files {
				if string(out[n]) != s || string(in[n]) != s {
					t.Errorf("%s changed:\n%s", n, out[n])
				}
			}
			if want := len(tc.files) + map[bool]int{true: 1}[tc.want != nil]; len(out) != want {
				t.Errorf("%d files, want %d: %v", len(out), want, slices.Sorted(maps.Keys(out)))
			}
			if got := declared(t, out); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("declared %v, want %v", got, tc.want)
			}
		})
	}

	// The entry is the one ConfigureProvider writes when the provider builds the template (it
	// adds the version it ships).
	main := map[string][]byte{"main.tf": []byte("resource \"kloudtest_machine\" \"a\" {}\n")}
	out, err := DeclareProviders(main, offered)
	if err != nil {
		t.Fatal(err)
	}
	built, err := ConfigureProvider(main, testProvider)
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Terraform struct {
			RequiredProviders map[string]map[string]string `json:"required_providers"`
		} `json:"terraform"`
	}
	if err := json.Unmarshal(built[testProvider.File], &g); err != nil {
		t.Fatal(err)
	}
	if got, want := declared(t, out)["kloudtest"]["source"], g.Terraform.RequiredProviders["kloudtest"]["source"]; got != want || got == "" {
		t.Errorf("plan declares source %q, the build %q", got, want)
	}

	// Another source is refused, naming where; so is a user file with the reserved name.
	wrong := map[string][]byte{"main.tf": []byte("resource \"kloudtest_machine\" \"a\" {}\n\nterraform {\n  required_providers {\n    kloudtest = { source = \"hashicorp/kloudtest\" }\n  }\n}\n")}
	if _, err := DeclareProviders(wrong, offered); err == nil || !strings.Contains(err.Error(), "main.tf:5,") || !strings.Contains(err.Error(), `must have source = "kloud/kloudtest" (found "hashicorp/kloudtest")`) {
		t.Errorf("wrong source: %v", err)
	}
	reserved := map[string][]byte{"main.tf": main["main.tf"], DeclaredFile: []byte("{}")}
	if _, err := DeclareProviders(reserved, offered); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("user file %s: %v", DeclaredFile, err)
	}
	if _, err := Parse(reserved); err == nil || !strings.Contains(err.Error(), DeclaredFile+": the name is reserved") {
		t.Errorf("Parse of a user file %s: %v", DeclaredFile, err)
	}
}
