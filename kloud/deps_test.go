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

// TestStackbuildDependencies keeps the build flow below the orchestrator, as coder's wsbuilder
// sits apart from coderd: kloud/stackbuild gets what it needs of kloud through its Deps (store,
// terraformer client, registry, kontrol, small interfaces of its own), never by importing the
// kloud package, its CLI or its UI.
func TestStackbuildDependencies(t *testing.T) {
	for _, dep := range testutil.Deps(t, "./kloud/stackbuild") {
		switch dep {
		case "github.com/kloud-dev/kloud/kloud", "github.com/kloud-dev/kloud/kloud/cli", "github.com/kloud-dev/kloud/kloud/web":
			t.Errorf("kloud/stackbuild links %s (it gets what it needs of kloud through stackbuild.Deps)", dep)
		}
	}
}
