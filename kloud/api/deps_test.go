package api_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// maxDeps bounds what `go list -deps ./kloud/api` prints (docs/CONTRIBUTING.md "Dependencies"):
// the kite client with kite/kitekey (206 packages, the standard library's included), then
// kloud/api, kloud/model, the leaf value types (provider/ptype, provider/pluginapi) and regexp:
// 212. Lower it when the count drops. What may be added: a leaf of value types a client
// shares (standard library only, like provider/ptype), or what the kite client itself comes to
// need; never a package of the server (package provider, userdata, a store, an engine).
const maxDeps = 212

// TestClientDependencies keeps kloud/api a client package: of package provider only the leaves
// ptype and pluginapi (no plugin host, no template parser, no JSON Schema compiler, no user data),
// no store, no terraform engine, no database driver, and no more packages than maxDeps.
func TestClientDependencies(t *testing.T) {
	deps := testutil.Deps(t, "./kloud/api")
	const mod = "github.com/kloud-dev/kloud/"
	forbidden := func(dep string) bool {
		switch {
		case dep == mod+"provider" || strings.HasPrefix(dep, mod+"provider/") && dep != mod+"provider/ptype" && dep != mod+"provider/pluginapi",
			dep == mod+"userdata",
			strings.HasPrefix(dep, "github.com/hashicorp/hcl/"), strings.HasPrefix(dep, "github.com/zclconf/go-cty/"),
			strings.HasPrefix(dep, "github.com/santhosh-tekuri/jsonschema/"), dep == "gopkg.in/yaml.v3",
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
			t.Errorf("kloud/api links %s (a client package links only the kite client and leaf value types)", dep)
		}
	}
	if len(deps) > maxDeps {
		t.Errorf("kloud/api links %d packages, more than %d: %s", len(deps), maxDeps, strings.Join(deps, " "))
	}
}
