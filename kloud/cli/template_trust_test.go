package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/providers/local"
)

// TestTemplateTrustCommand: `kloud template trust|untrust` as the administrator, refused for a
// member; a member's `template create` of a hostile template names the rule and place.
func TestTemplateTrustCommand(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "dummy", ResourceType: "terraform_data", UserDataAttr: "input"})
	kloudDir := t.TempDir()
	e := kloudtest.Start(t, kloudtest.Options{DataDir: kloudDir, Providers: reg})
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), append(args, "--url", e.URL), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	admin := func(args ...string) (int, string, string) { return run(append(args, "--data-dir", kloudDir)...) }
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	alice := func(args ...string) (int, string, string) {
		return run(append(args, "--data-dir", kloudDir, "--key", aliceKey)...)
	}
	must := func(code int, stdout, stderr string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		return stdout
	}
	must(admin("user", "add", "alice", "--team", model.DefaultTeam))
	must(admin("key", "create", "--username", "alice", "--out", aliceKey))

	hostile := "resource \"terraform_data\" \"vm\" {\n  input = \"hi\"\n  provisioner \"local-exec\" { command = \"id\" }\n}\n"
	main := filepath.Join(t.TempDir(), "main.tf")
	if err := os.WriteFile(main, []byte(hostile), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := alice("template", "create", "--title", "x", "--file", main)
	if code == 0 || !strings.Contains(stderr, `main.tf:3:3: provisioner "local-exec" is not allowed (rule provisioner)`) {
		t.Fatalf("member's hostile template: exit %d: %s", code, stderr)
	}

	// One stored before the policy.
	now := time.Now()
	tpl := model.Template{ID: store.NewID(), Title: "old", Team: model.DefaultTeam, Owner: "alice", Rev: 1,
		Files: []model.File{{Name: "main.tf", Content: hostile}}, CreatedAt: now, UpdatedAt: now}
	if err := e.Server.Store().Templates().Insert(t.Context(), tpl); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := alice("template", "trust", tpl.ID, "--allow", "provisioner", "--reason", "mine"); code == 0 || !strings.Contains(stderr, "administrator") {
		t.Fatalf("member trusted: exit %d: %s", code, stderr)
	}
	if code, _, stderr := admin("template", "trust", tpl.ID, "--allow", "provisioner"); code == 0 || !strings.Contains(stderr, "--reason") {
		t.Fatalf("trust without a reason: exit %d: %s", code, stderr)
	}
	if code, _, stderr := admin("template", "trust", tpl.ID, "--allow", "everything", "--reason", "x"); code == 0 || !strings.Contains(stderr, `unknown rule "everything"`) {
		t.Fatalf("trust of an unknown rule: exit %d: %s", code, stderr)
	}
	out := must(admin("template", "trust", tpl.ID, "--allow", "provisioner,host-function", "--reason", "reviewed"))
	if !strings.Contains(out, "rev 1 trusted by admin: rules host-function, provisioner lifted") {
		t.Fatalf("trust: %s", out)
	}
	if out := must(alice("template", "get", tpl.ID)); !strings.Contains(out, "trusted: rev 1 lifts host-function,provisioner (by admin at ") || !strings.Contains(out, ": reviewed)") {
		t.Fatalf("template get does not show the trust: %s", out)
	}
	if out := must(admin("template", "untrust", tpl.ID)); !strings.Contains(out, "1 trusted revision(s) untrusted") {
		t.Fatalf("untrust: %s", out)
	}
}

// TestDemoTemplatePassesPolicy: the template kloud serve offers passes the template policy of
// a kloud with the local provider.
func TestDemoTemplatePassesPolicy(t *testing.T) {
	t.Parallel()
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: local.Name, ResourceType: local.ResourceType})
	c, err := tmpl.Parse(map[string][]byte{"main.tf": []byte(cli.DemoTemplate)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckPolicy(reg.TemplatePolicy()); err != nil {
		t.Fatalf("the demo template is refused: %v", err)
	}
}
