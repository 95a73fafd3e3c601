package provider_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestDependencies keeps the provider contract free of the transport and the agent: a provider
// links neither kite nor klient (the planner, which talks to agents, lives in kloud/stackbuild).
func TestDependencies(t *testing.T) {
	deps := testutil.Deps(t, "./provider/...")
	forbidden := []string{
		"github.com/kloud-dev/kloud/kite", "github.com/kloud-dev/kloud/klient",
		"github.com/kloud-dev/kloud/kontrol", "github.com/kloud-dev/kloud/kloud",
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("provider/ links %s", dep)
			}
		}
	}
}
