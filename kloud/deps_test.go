package kloud_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the orchestrator off the agent's implementation: kloud and its command
// call klient through klient/klientapi (wire types), never link klient itself or its PTY
// manager (klient/webterm).
func TestDependencies(t *testing.T) {
	t.Parallel()
	deps := testutil.Deps(t, "./kloud/...", "./cmd/kloud")
	for _, dep := range deps {
		if dep == "github.com/kloud-dev/kloud/klient" || strings.HasPrefix(dep, "github.com/kloud-dev/kloud/klient/") && dep != "github.com/kloud-dev/kloud/klient/klientapi" {
			t.Errorf("kloud links %s (it may use klient/klientapi only)", dep)
		}
	}
}
