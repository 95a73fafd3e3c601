package provider_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// bridges are the packages under provider/ that exist to connect a provider to the rest of
// Kloud, and so may link it: provider/plugin (a provider served over kite) and
// provider/pluginapi (that protocol's wire types: a manifest's name is a plugin key's,
// kite/kitekey). The conformance suite, which runs a kloud, is e2e/providertest
// (e2e/layers_test.go keeps harnesses in their layer).
var bridges = map[string]bool{
	"github.com/kloud-dev/kloud/provider/plugin":    true,
	"github.com/kloud-dev/kloud/provider/pluginapi": true,
}

// TestDependencies keeps the provider contract free of the transport and the agent: a provider
// links neither kite nor klient (the planner, which talks to agents, lives in kloud/stackbuild).
func TestDependencies(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "./provider/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./provider/...: %v", err)
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		if !bridges[p] {
			pkgs = append(pkgs, p)
		}
	}
	deps := testutil.Deps(t, pkgs...)
	forbidden := []string{
		"github.com/kloud-dev/kloud/kite", "github.com/kloud-dev/kloud/klient",
		"github.com/kloud-dev/kloud/kontrol", "github.com/kloud-dev/kloud/kloud",
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("the provider contract (%s) links %s", strings.Join(pkgs, " "), dep)
			}
		}
	}
}
