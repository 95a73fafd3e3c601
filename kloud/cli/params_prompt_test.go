package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
)

// TestPromptParams: stack create asks for each required parameter without a value (given,
// or in the preset that applies), showing its description and choices, and types the answer.
func TestPromptParams(t *testing.T) {
	ps := api.TemplateParametersResult{TemplateID: "t1",
		Parameters: []api.TemplateParameter{
			{Name: "size", DisplayName: "Machine size", Type: "string", Required: true, Description: "How big", Choices: []json.RawMessage{[]byte(`"small"`), []byte(`"large"`)}},
			{Name: "cpus", Type: "number", Required: true},
			{Name: "repo", Type: "string", Required: true},
			{Name: "tags", Type: "list(string)", Default: json.RawMessage(`[]`)},
		},
		Presets: []api.TemplatePreset{{Name: "p", Default: true, Values: map[string]json.RawMessage{"repo": []byte(`"x"`)}}},
	}
	var out bytes.Buffer
	p := api.StackPlanParams{TemplateID: "t1", Parameters: map[string]json.RawMessage{}}
	if err := promptParams(strings.NewReader("large\n3\n"), &out, ps, &p); err != nil {
		t.Fatal(err)
	}
	if string(p.Parameters["size"]) != `"large"` || string(p.Parameters["cpus"]) != "3" || p.Parameters["repo"] != nil || p.Parameters["tags"] != nil {
		t.Errorf("parameters: %s", p.Parameters)
	}
	for _, want := range []string{"Machine size (size), string: How big", `choices: "small", "large"`, "cpus, number"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("prompt lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "repo") {
		t.Errorf("asked for repo, which the default preset gives:\n%s", out.String())
	}
}
