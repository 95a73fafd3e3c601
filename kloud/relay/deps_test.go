package relay_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the relays below the orchestrator: kloud/relay gets what it needs of
// kloud through its Options' interfaces, never by importing kloud (or its store, CLI or UI),
// reaches klient through klient/klientapi only, and links no kontrol, terraformer or plugin
// host.
func TestDependencies(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kloud-dev/kloud/"
	for _, dep := range testutil.Deps(t, "./kloud/relay") {
		p, ours := strings.CutPrefix(dep, mod)
		if !ours {
			continue
		}
		switch {
		case p == "kloud/relay", p == "kloud/model":
		case p == "kloud" || strings.HasPrefix(p, "kloud/"):
			t.Errorf("kloud/relay links %s (it gets what it needs of kloud through relay.Options)", dep)
		case p == "klient" || strings.HasPrefix(p, "klient/") && p != "klient/klientapi":
			t.Errorf("kloud/relay links %s (it may use klient/klientapi only)", dep)
		case p == "kontrol" || strings.HasPrefix(p, "kontrol/") && p != "kontrol/kontrolapi",
			strings.HasPrefix(p, "terraformer"), strings.HasPrefix(p, "provider/plugin"):
			t.Errorf("kloud/relay links %s", dep)
		}
	}
}
