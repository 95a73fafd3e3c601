package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestBrowserAccessibility checks every page of the web UI for accessibility in the real
// Chromium (e2e/browser/a11y.mjs): axe-core's WCAG 2.0/2.1 A and AA rules find nothing on any
// page a member (alice) or a kloud administrator (ops) sees, with the data of a built stack of
// the dummy provider in them (machines, a machine's page and its terminal, the stack's page and
// its update plan, the template editor with a plan, the stack-create form with its plan, a
// credential opened, teams, quotas with the administrators' form, the audit log, buckets,
// providers, the login page, a notice); every element with a click listener is reachable by
// Tab and shows its focus; Shift+Tab leaves the terminal; alice logs in, goes to another page
// and shares her machine by keyboard only. The failure lists each violation: user, page, rule,
// elements.
// Screenshots in $KLOUD_ARTIFACTS/TestBrowserAccessibility.
func TestBrowserAccessibility(t *testing.T) {
	node, script, out := browserPrereqs(t)
	if _, err := os.Stat(filepath.Join(script, "node_modules", "axe-core", "axe.min.js")); err != nil {
		testutil.Unavailable(t, "test needs axe-core in e2e/browser/node_modules (scripts/setup-browser.sh runs npm ci there)")
	}
	e := newEnv(t)
	password := browserUsers(t, e)
	// alice's credential and a built stack of two machines, through the CLI (the dummy
	// provider's machines are klient processes: a build takes a second).
	key := filepath.Join(e.dir, "alice.key")
	e.run("key", "create", "--username", "alice", "--out", key)
	e.key = key
	e.run("credential", "add", "--provider", "dummy", "--title", "mine", "--field", "token=abc123")
	sid := e.createStack(e.template(`
resource "terraform_data" "vm" {
  count = 2
  input = "#!/bin/bash\necho ready"
}
`))
	e.apply(sid)
	e.key = ""
	runBrowserScript(t, e, node, script, out, "a11y.mjs", nil, "KLOUD_PASSWORD="+password,
		"KLOUD_ADMIN=ops", "KLOUD_ADMIN_PASSWORD="+password, "KLOUD_SHARE_USER=bob")
	if _, err := os.Stat(filepath.Join(out, "a11y-alice-terminal.png")); err != nil {
		t.Fatalf("no screenshot of the terminal page: %v", err)
	}
}
