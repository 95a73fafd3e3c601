package plugin_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
	"github.com/kloud-dev/kloud/provider/tmpl"
)

// ruled is a plugin's stack with a template rule: its machines may not be privileged.
type ruled struct {
	provider.Stack
	resourceType string
}

func (r *ruled) ValidateTemplate(ctx context.Context, files map[string][]byte) ([]provider.TemplateFinding, error) {
	cfg, err := tmpl.Parse(files)
	if err != nil {
		return nil, err
	}
	var out []provider.TemplateFinding
	for _, res := range cfg.Resources(r.resourceType) {
		if v, _ := cfg.LiteralAttrs(r.resourceType, res.Name)["privileged"].(bool); v {
			out = append(out, provider.TemplateFinding{File: res.File, Line: res.Line, Construct: r.resourceType + "." + res.Name + ": privileged",
				Rule: "files-privileged", Detail: "files machines are never privileged"})
		}
	}
	return out, nil
}

// TestTemplateRulesOverTheWire: a plugin whose stack implements provider.TemplateValidator
// advertises templateRules; kloud's proxy stack sends the files and gets its findings back (file,
// line, rule, detail); a template within its rules has none. A plugin without the capability is
// not asked (ErrUnsupported, which kloud never meets: it asks only providers that can).
func TestTemplateRulesOverTheWire(t *testing.T) {
	e := startKloud(t)
	p := filesProvider("rules", newSeen("a"), noUnavailable())
	inner := p.Stack
	p.Stack = func(b *provider.BaseStack) (provider.Stack, error) {
		st, err := inner(b)
		return &ruled{Stack: st, resourceType: "rules_machine"}, err
	}
	m, err := plugin.ManifestOf(p)
	if err != nil || !slices.Contains(m.Capabilities, provider.CapTemplateRules) {
		t.Fatalf("manifest: %+v, %v: want templateRules advertised", m, err)
	}
	e.run(p, e.pluginKey("rules"))
	e.wait("rules")
	proxy, err := e.reg.Lookup("rules")
	if err != nil {
		t.Fatal(err)
	}
	if !proxy.Can(provider.CapTemplateRules) {
		t.Fatalf("proxy capabilities %v", proxy.Caps())
	}
	st, err := proxy.Stack(&provider.BaseStack{Provider: proxy, Team: "t", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	tv := st.(provider.TemplateValidator)
	fs, err := tv.ValidateTemplate(t.Context(), map[string][]byte{"main.tf": []byte("resource \"rules_machine\" \"a\" {\n  size = 1\n}\n\nresource \"rules_machine\" \"b\" {\n  privileged = true\n}\n")})
	if err != nil || len(fs) != 1 {
		t.Fatalf("findings %v, %v: want one", fs, err)
	}
	if got, want := fs[0].Error(), "main.tf:5: rules_machine.b: privileged is not allowed (rule files-privileged): files machines are never privileged"; got != want {
		t.Fatalf("finding %q, want %q", got, want)
	}
	if fs, err := tv.ValidateTemplate(t.Context(), map[string][]byte{"main.tf": []byte("resource \"rules_machine\" \"a\" {}\n")}); err != nil || len(fs) != 0 {
		t.Fatalf("a template within the rules: %v, %v", fs, err)
	}

	// A plugin without rules.
	plain := filesProvider("plain", newSeen("b"), noUnavailable())
	e.run(plain, e.pluginKey("plain"))
	e.wait("plain")
	pp, err := e.reg.Lookup("plain")
	if err != nil {
		t.Fatal(err)
	}
	if pp.Can(provider.CapTemplateRules) {
		t.Fatalf("a plugin without rules advertises them: %v", pp.Caps())
	}
	pst, err := pp.Stack(&provider.BaseStack{Provider: pp})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pst.(provider.TemplateValidator).ValidateTemplate(t.Context(), map[string][]byte{"main.tf": []byte("")}); !errors.Is(err, provider.ErrUnsupported) {
		t.Fatalf("proxy of a plugin without rules: %v", err)
	}
}
