package local

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// TestApplyTemplateVacating: a template without local machines is left alone, unless the stack
// still has local machines the template no longer declares (BaseStack.Vacating, a stack update
// removing them all): then the kloudlocal provider is configured, with a token that creates
// none, so Terraform can destroy them.
func TestApplyTemplateVacating(t *testing.T) {
	testutil.RequireRoot(t)
	if err := sandbox.Available(); err != nil {
		testutil.Unavailable(t, "%s", err)
	}
	l, err := New(Options{StateDir: t.TempDir(), BaseImage: "/nonexistent", Instance: "kloud-t", Endpoint: want})
	if err != nil {
		t.Fatal(err)
	}
	const other = "resource \"terraform_data\" \"other\" {\n  input = \"x\"\n}\n"
	apply := func(vacating bool) *provider.Template {
		st, err := l.Provider().Stack(&provider.BaseStack{Provider: l.Provider(), StackID: "st1", Vacating: vacating,
			Template: &provider.Template{Files: map[string][]byte{"main.tf": []byte(other)}, Variables: map[string]any{}}})
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := st.ApplyTemplate(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return tpl
	}
	if tpl := apply(false); len(tpl.Files) != 1 || tpl.Variables[TokenVar] != nil {
		t.Fatalf("a template without local machines was rewritten: %v", tpl.Variables)
	}
	tpl := apply(true)
	if g := string(tpl.Files[GeneratedFile]); !strings.Contains(g, want) || !strings.Contains(g, "kloudlocal") {
		t.Fatalf("%s when vacating:\n%s", GeneratedFile, g)
	}
	tok, _ := tpl.Variables[TokenVar].(string)
	if c, err := l.parseToken(tok, false); err != nil || c.Stack != "st1" || len(c.Machines) != 0 {
		t.Fatalf("token when vacating: %+v %v", c, err)
	}
}
