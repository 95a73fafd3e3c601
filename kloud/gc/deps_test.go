package gc_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the garbage collector below the orchestrator: kloud/gc gets what it
// needs of kloud through its Options' interfaces, never by importing kloud (or its CLI or UI);
// it reaches the store through kloud/store's repositories, reads Terraform states through
// terraformer's wire types (kloud/stackbuild's state walk), and links no kontrol, terraformer
// engine or plugin host.
func TestDependencies(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kloud-dev/kloud/"
	for _, dep := range testutil.Deps(t, "./kloud/gc") {
		p, ours := strings.CutPrefix(dep, mod)
		if !ours {
			continue
		}
		switch {
		case p == "kloud/gc", p == "kloud/model", p == "kloud/api", p == "kloud/store", p == "kloud/stackbuild":
		case p == "kloud" || strings.HasPrefix(p, "kloud/"):
			t.Errorf("kloud/gc links %s (it gets what it needs of kloud through gc.Options)", dep)
		case p == "kontrol" || strings.HasPrefix(p, "kontrol/") && p != "kontrol/kontrolapi",
			strings.HasPrefix(p, "terraformer") && p != "terraformer/tfapi",
			strings.HasPrefix(p, "provider/plugin") && p != "provider/pluginapi":
			t.Errorf("kloud/gc links %s", dep)
		}
	}
}
