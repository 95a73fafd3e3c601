package tmpl

import (
	"encoding/json"
	"strings"
	"testing"
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
