package tfapi_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestNoEngine keeps tfapi what kloud links of terraformer: no engine (terraformer/tfrun,
// terraform-exec), no sandbox, no service.
func TestNoEngine(t *testing.T) {
	for _, dep := range testutil.Deps(t, "./terraformer/tfapi") {
		if dep == "github.com/kloud-dev/kloud/terraformer" || strings.HasPrefix(dep, "github.com/kloud-dev/kloud/terraformer/") && dep != "github.com/kloud-dev/kloud/terraformer/tfapi" ||
			strings.HasPrefix(dep, "github.com/hashicorp/terraform-exec") {
			t.Errorf("terraformer/tfapi links %s", dep)
		}
	}
}
