package snapshots_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the snapshot engine below the orchestrator: kloud/snapshots gets what
// it needs of kloud through its Options' interfaces, never by importing kloud (or its CLI or
// UI); it reaches the store through kloud/store's repositories and waits for agents with
// kloud/stackbuild's planner, and links no kontrol, terraformer engine or plugin host.
func TestDependencies(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kloud-dev/kloud/"
	for _, dep := range testutil.Deps(t, "./kloud/snapshots") {
		p, ours := strings.CutPrefix(dep, mod)
		if !ours {
			continue
		}
		switch {
		case p == "kloud/snapshots", p == "kloud/model", p == "kloud/api", p == "kloud/store", p == "kloud/stackbuild":
		case p == "kloud" || strings.HasPrefix(p, "kloud/"):
			t.Errorf("kloud/snapshots links %s (it gets what it needs of kloud through snapshots.Options)", dep)
		case p == "kontrol" || strings.HasPrefix(p, "kontrol/") && p != "kontrol/kontrolapi",
			strings.HasPrefix(p, "terraformer") && p != "terraformer/tfapi",
			strings.HasPrefix(p, "provider/plugin") && p != "provider/pluginapi":
			t.Errorf("kloud/snapshots links %s", dep)
		}
	}
}
