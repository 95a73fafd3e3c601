package login_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the web login below the orchestrator: it gets what it needs of kloud
// through its Options (the store's repositories, small interfaces for users, sessions and the
// audit log), never by importing the kloud package, its CLI or UI, the plugin host or a
// terraform engine.
func TestDependencies(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kloud-dev/kloud/"
	for _, dep := range testutil.Deps(t, "./kloud/login", "./kloud/kloudhttp") {
		p, ok := strings.CutPrefix(dep, mod)
		if !ok {
			continue
		}
		switch {
		case p == "kloud", p == "kloud/cli", p == "kloud/web", p == "kloud/stackbuild", p == "kloud/pluginhost",
			p == "provider/plugin", strings.HasPrefix(p, "terraformer/"):
			t.Errorf("kloud/login links %s (it gets what it needs of kloud through its Options)", dep)
		}
	}
}
