package webterm_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/webterm"
	"github.com/kloud-dev/kloud/userdata"
)

// TestRenameOwnerAccount renames the owner's account as kloud's user data made it, in a machine
// root of the test's (usermod --prefix): login, group, home /home/<old> moved to /home/<new>
// with its files, sudo rule; the uid stays. It refuses to rename onto an existing account or an
// account the user data did not make, and answers "already" and "none" when there is nothing to
// do.
func TestRenameOwnerAccount(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "usermod")
	root := t.TempDir()
	write := func(name, content string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/passwd", "root:x:0:0:root:/root:/bin/bash\nkpool:x:4300:4300:"+userdata.OwnerGecos+":/home/kpool:/bin/bash\n"+
		"dave:x:4301:4301:someone else:/home/dave:/bin/bash\n", 0o644)
	write("etc/group", "root:x:0:\nkpool:x:4300:\ndave:x:4301:\nsudo:x:27:kpool\n", 0o644)
	write("etc/shadow", "root:*:19000:0:99999:7:::\nkpool:!:19000:0:99999:7:::\ndave:!:19000:0:99999:7:::\n", 0o640)
	write("etc/gshadow", "root:*::\nkpool:!::\ndave:!::\nsudo:*::kpool\n", 0o640)
	write("etc/sudoers.d/90-cloud-init-users", "# User rules for kpool\nkpool ALL=(ALL) NOPASSWD:ALL\n", 0o440)
	write("home/kpool/project/README", "cloned by the template's user data\n", 0o644)
	ctx := t.Context()

	for _, c := range []struct{ old, new, why string }{
		{"kpool", "dave", "onto an existing account"},
		{"dave", "erin", "an account kloud's user data did not make"},
		{"kpool", "Erin", "a name that is not a username"},
	} {
		if _, err := webterm.RenameOwnerAccount(ctx, root, c.old, c.new); err == nil {
			t.Errorf("renamed %s to %s (%s)", c.old, c.new, c.why)
		} else if !errors.Is(err, kite.ErrState) && !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("%s: %v, want a state or params error", c.why, err)
		}
	}
	got, err := webterm.RenameOwnerAccount(ctx, root, "kpool", "erin")
	if err != nil || got != "renamed" {
		t.Fatalf("rename kpool to erin: %q %v", got, err)
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(root, name))
		return string(b)
	}
	if p := read("etc/passwd"); !strings.Contains(p, "\nerin:x:4300:4300:"+userdata.OwnerGecos+":/home/erin:/bin/bash\n") || strings.Contains(p, "kpool") {
		t.Errorf("passwd:\n%s", p)
	}
	if g := read("etc/group"); !strings.Contains(g, "\nerin:x:4300:\n") || !strings.Contains(g, "sudo:x:27:erin") || strings.Contains(g, "kpool") {
		t.Errorf("group:\n%s", g)
	}
	if s := read("etc/sudoers.d/90-cloud-init-users"); s != "# User rules for erin\nerin ALL=(ALL) NOPASSWD:ALL\n" {
		t.Errorf("sudoers:\n%s", s)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/sudoers.d/90-cloud-init-users")); err != nil || fi.Mode().Perm() != 0o440 {
		t.Errorf("sudoers mode: %v %v", fi, err)
	}
	if r := read("home/erin/project/README"); r != "cloned by the template's user data\n" {
		t.Errorf("the home did not move with its files: %q", r)
	}
	if _, err := os.Stat(filepath.Join(root, "home/kpool")); !os.IsNotExist(err) {
		t.Errorf("home/kpool is still there: %v", err)
	}
	if got, err := webterm.RenameOwnerAccount(ctx, root, "kpool", "erin"); err != nil || got != "already" {
		t.Errorf("again: %q %v, want already", got, err)
	}
	if got, err := webterm.RenameOwnerAccount(ctx, root, "nobody2", "frank"); err != nil || got != "none" {
		t.Errorf("no owner account: %q %v, want none", got, err)
	}
}
