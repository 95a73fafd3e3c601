package metrics_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the metrics below the orchestrator: kloud/metrics gets what it needs of
// kloud through its Options' interfaces, never by importing kloud (or its store, relay, CLI or
// UI), reaches klient through klient/klientapi only, and links no kontrol, terraformer or
// plugin host (the plugin protocol's types, provider/pluginapi, come with kloud/api).
func TestDependencies(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kloud-dev/kloud/"
	for _, dep := range testutil.Deps(t, "./kloud/metrics") {
		p, ours := strings.CutPrefix(dep, mod)
		if !ours {
			continue
		}
		switch {
		case p == "kloud/metrics", p == "kloud/model", p == "kloud/api":
		case p == "kloud" || strings.HasPrefix(p, "kloud/"):
			t.Errorf("kloud/metrics links %s (it gets what it needs of kloud through metrics.Options)", dep)
		case p == "klient" || strings.HasPrefix(p, "klient/") && p != "klient/klientapi":
			t.Errorf("kloud/metrics links %s (it may use klient/klientapi only)", dep)
		case p == "kontrol" || strings.HasPrefix(p, "kontrol/") && p != "kontrol/kontrolapi",
			strings.HasPrefix(p, "terraformer"), strings.HasPrefix(p, "provider/plugin") && p != "provider/pluginapi":
			t.Errorf("kloud/metrics links %s", dep)
		}
	}
}
