package api_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// maxDeps bounds what `go list -deps ./kloud/api` prints (docs/CONTRIBUTING.md "Dependencies"):
// the client package links the kite client and the wire types, nothing of the server. Lower it
// when the count drops; raising it needs a reason a client shares.
const maxDeps = 256

// TestClientDependencies keeps kloud/api a client package: no plugin host, no store, no
// terraform engine, no database driver, and no more packages than maxDeps.
func TestClientDependencies(t *testing.T) {
	deps := testutil.Deps(t, "./kloud/api")
	const mod = "github.com/kloud-dev/kloud/"
	forbidden := func(dep string) bool {
		switch {
		case dep == mod+"provider/plugin" || strings.HasPrefix(dep, mod+"provider/plugin/"),
			dep == mod+"kloud" || strings.HasPrefix(dep, mod+"kloud/store"),
			dep == mod+"terraformer" || strings.HasPrefix(dep, mod+"terraformer/") && dep != mod+"terraformer/tfapi",
			strings.HasPrefix(dep, "github.com/hashicorp/terraform-exec"),
			strings.HasPrefix(dep, "go.mongodb.org/"),
			strings.HasPrefix(dep, "github.com/FerretDB/"):
			return true
		}
		return false
	}
	for _, dep := range deps {
		if forbidden(dep) {
			t.Errorf("kloud/api links %s (a client package links only the kite client and wire types)", dep)
		}
	}
	if len(deps) > maxDeps {
		t.Errorf("kloud/api links %d packages, more than %d: %s", len(deps), maxDeps, strings.Join(deps, " "))
	}
}
