package cli_test

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/cli"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
)

// TestUserRoleCommand: `kloud user role` as an owner sets a role (twice: the same answer), shown
// by `user list` (ROLE column, and role in --json) and `whoami`; a member may not; a role that
// does not exist and the built-in admin get a clear error; an auditor is refused a change
// (team create) with the reason.
func TestUserRoleCommand(t *testing.T) {
	t.Parallel()
	kloudDir := t.TempDir()
	e := kloudtest.Start(t, kloudtest.Options{DataDir: kloudDir})
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := cli.Run(t.Context(), append(args, "--url", e.URL), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	admin := func(args ...string) (int, string, string) { return run(append(args, "--data-dir", kloudDir)...) }
	keyOf := func(u string) func(args ...string) (int, string, string) {
		key := filepath.Join(t.TempDir(), u+".key")
		if code, out, errOut := admin("key", "create", "--username", u, "--out", key); code != 0 {
			t.Fatalf("key create %s: %s %s", u, out, errOut)
		}
		return func(args ...string) (int, string, string) {
			return run(append(args, "--data-dir", kloudDir, "--key", key)...)
		}
	}
	must := func(code int, stdout, stderr string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
		return stdout
	}
	must(admin("user", "add", "carol", "--team", model.DefaultTeam))
	must(admin("user", "add", "bob", "--team", model.DefaultTeam))
	for range 2 {
		if out := must(admin("user", "role", "carol", "auditor")); out != "carol is now auditor\n" {
			t.Fatalf("user role: %q", out)
		}
	}
	out := must(admin("user", "list"))
	if !regexp.MustCompile(`(?m)^carol\s+auditor\s`).MatchString(out) || !regexp.MustCompile(`(?m)^admin\s+owner\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^bob\s+member\s`).MatchString(out) {
		t.Fatalf("user list:\n%s", out)
	}
	var users []api.UserView
	if err := json.Unmarshal([]byte(must(admin("user", "list", "--json"))), &users); err != nil {
		t.Fatal(err)
	}
	for _, u := range users {
		if u.Username == "carol" && u.Role != model.RoleAuditor {
			t.Fatalf("user list --json: %+v", u)
		}
	}
	carol, bob := keyOf("carol"), keyOf("bob")
	if out := must(carol("whoami")); !strings.HasPrefix(out, "carol (auditor), authenticated") {
		t.Fatalf("whoami of an auditor: %s", out)
	}
	if code, _, errOut := carol("team", "create", "spies"); code == 0 || !strings.Contains(errOut, "auditors change nothing") {
		t.Fatalf("an auditor's team create: exit %d: %s", code, errOut)
	}
	if code, _, errOut := bob("user", "role", "bob", "owner"); code == 0 || !strings.Contains(errOut, "owners") {
		t.Fatalf("a member's user role: exit %d: %s", code, errOut)
	}
	if code, _, errOut := admin("user", "role", "bob", "root"); code == 0 || !strings.Contains(errOut, "owner, template-admin, auditor, member") {
		t.Fatalf("user role with an unknown role: exit %d: %s", code, errOut)
	}
	if code, _, errOut := admin("user", "role", "admin", "member"); code == 0 || !strings.Contains(errOut, "always an owner") {
		t.Fatalf("user role admin member: exit %d: %s", code, errOut)
	}
	if out := must(admin("whoami")); !strings.HasPrefix(out, "admin (owner: kloud administrator)") {
		t.Fatalf("whoami of the admin: %s", out)
	}
}
