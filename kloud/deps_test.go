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

// TestEngineDependencies keeps kloud's engines below the orchestrator, as coder's wsbuilder sits
// apart from coderd: each gets what it needs of kloud through its Options or Deps (the store's
// repositories, small interfaces of its own), never by importing the kloud package, its CLI or
// UI, or another engine it was not given. Of kontrol, klient, terraformer and the plugin host
// they link the wire types only (kontrolapi, klientapi, tfapi, pluginapi); the plugin host alone
// links provider/plugin, the host it wraps.
func TestEngineDependencies(t *testing.T) {
	t.Parallel()
	const mod = "github.com/kloud-dev/kloud/"
	wire := map[string]bool{"kontrol/kontrolapi": true, "klient/klientapi": true, "terraformer/tfapi": true, "provider/pluginapi": true}
	for pkg, may := range map[string][]string{
		// the kloud/* packages each may link besides itself
		"kloud/stackbuild": {"kloud/model", "kloud/api", "kloud/store"},
		"kloud/relay":      {"kloud/model", "kloud/kloudhttp"},
		"kloud/login":      {"kloud/model", "kloud/api", "kloud/store", "kloud/kloudhttp"},
		"kloud/kloudhttp":  {},
		"kloud/pluginhost": {"kloud/model", "kloud/api", "provider/plugin"},
		"kloud/snapshots":  {"kloud/model", "kloud/api", "kloud/store", "kloud/stackbuild"},
		"kloud/gc":         {"kloud/model", "kloud/api", "kloud/store", "kloud/stackbuild"},
		"kloud/quota":      {"kloud/model", "kloud/api", "kloud/store"},
		"kloud/idle":       {"kloud/model", "kloud/api"},
		"kloud/metrics":    {"kloud/model", "kloud/api"},
	} {
		allowed := map[string]bool{pkg: true}
		for _, m := range may {
			allowed[m] = true
		}
		for _, dep := range testutil.Deps(t, "./"+pkg) {
			p, ours := strings.CutPrefix(dep, mod)
			if !ours || allowed[p] || wire[p] {
				continue
			}
			for _, top := range []string{"kloud", "kontrol", "klient", "terraformer", "provider/plugin"} {
				if p == top || strings.HasPrefix(p, top+"/") {
					t.Errorf("%s links %s (it gets what it needs of kloud through its Options; of %s it may link the wire types only)", pkg, p, top)
					break
				}
			}
		}
	}
}
