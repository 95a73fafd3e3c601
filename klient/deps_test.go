package klient_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the agent small and free of the orchestrator's parts: klient must not
// link provider/, terraformer/, kontrol (the registry: klient speaks kontrol/kontrolapi), Mongo
// or FerretDB (ARCHITECTURE §1).
func TestDependencies(t *testing.T) {
	deps := testutil.Deps(t, "./cmd/klient")
	forbidden := []string{
		"github.com/kloud-dev/kloud/provider", "github.com/kloud-dev/kloud/providers/",
		"github.com/kloud-dev/kloud/terraformer", "github.com/kloud-dev/kloud/kloud",
		"go.mongodb.org/", "github.com/FerretDB/", "github.com/hashicorp/terraform",
	}
	for _, dep := range deps {
		if dep == "github.com/kloud-dev/kloud/kontrol" || strings.HasPrefix(dep, "github.com/kloud-dev/kloud/kontrol/") && dep != "github.com/kloud-dev/kloud/kontrol/kontrolapi" {
			t.Errorf("klient links %s (it may use kontrol/kontrolapi only)", dep)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("klient links %s", dep)
			}
		}
	}
}
