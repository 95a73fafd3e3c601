package kloud_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the orchestrator off the agent's implementation: kloud and its command
// call klient through klient/klientapi (wire types), never link klient itself or its PTY
// manager (klient/webterm).
func TestDependencies(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "./kloud/...", "./cmd/kloud")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/kloud-dev/kloud/klient" || strings.HasPrefix(dep, "github.com/kloud-dev/kloud/klient/") && dep != "github.com/kloud-dev/kloud/klient/klientapi" {
			t.Errorf("kloud links %s (it may use klient/klientapi only)", dep)
		}
	}
}
