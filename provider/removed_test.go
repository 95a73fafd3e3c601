package provider_test

import (
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/provider"
)

// RemovedResources names each resource whose block is gone once, sorted, counted ("vm.0",
// "vm.1") or not ("web"), and none that the template still declares.
func TestRemovedResources(t *testing.T) {
	declared := map[string][]string{"db": {"db"}, "app": {"app.0"}}
	got := provider.RemovedResources([]string{"web", "vm.1", "db", "vm.0", "app.3", "app.0"}, declared)
	if want := []string{"vm", "web"}; !slices.Equal(got, want) {
		t.Fatalf("RemovedResources = %q, want %q", got, want)
	}
	if got := provider.RemovedResources([]string{"db"}, declared); got != nil {
		t.Fatalf("nothing removed: %q", got)
	}
	if got := provider.RemovedResources([]string{"vm.0"}, map[string]bool{}); !slices.Equal(got, []string{"vm"}) {
		t.Fatalf("every block removed (a vacating stack): %q", got)
	}
	if got := provider.ResourceOfLabel("web.12"); got != "web" {
		t.Fatalf("ResourceOfLabel(web.12) = %q", got)
	}
}
