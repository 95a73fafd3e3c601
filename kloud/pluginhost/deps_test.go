package pluginhost_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the plugin host below the orchestrator: it gets what it needs of kloud
// through its Options (the provider registry, a key minter, a logger), never by importing the
// kloud package, its CLI, UI or store, nor a terraform engine.
func TestDependencies(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kloud-dev/kloud/"
	for _, dep := range testutil.Deps(t, "./kloud/pluginhost") {
		p, ok := strings.CutPrefix(dep, mod)
		if !ok {
			continue
		}
		switch {
		case p == "kloud", p == "kloud/cli", p == "kloud/web", p == "kloud/store", p == "kloud/stackbuild",
			strings.HasPrefix(p, "terraformer/tfrun"), strings.HasPrefix(p, "terraformer/tfsandbox"):
			t.Errorf("kloud/pluginhost links %s (it gets what it needs of kloud through its Options)", dep)
		}
	}
}
