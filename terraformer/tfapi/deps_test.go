package tfapi_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestNoEngine keeps tfapi, tfclient and tfpool what kloud links of terraformer: tfapi links
// nothing of the module (the engine, terraformer/tfrun, names its types), tfclient and tfpool no
// engine (tfrun, terraform-exec), sandbox or service.
func TestNoEngine(t *testing.T) {
	const mod = "github.com/kloud-dev/kloud/"
	for _, dep := range testutil.Deps(t, "./terraformer/tfapi") {
		if strings.HasPrefix(dep, mod) && dep != mod+"terraformer/tfapi" || strings.HasPrefix(dep, "github.com/hashicorp/terraform-exec") {
			t.Errorf("terraformer/tfapi links %s", dep)
		}
	}
	for _, pkg := range []string{"tfclient", "tfpool"} {
		for _, dep := range testutil.Deps(t, "./terraformer/"+pkg) {
			if dep == mod+"terraformer" || strings.HasPrefix(dep, mod+"terraformer/") && dep != mod+"terraformer/tfapi" && dep != mod+"terraformer/tfclient" && dep != mod+"terraformer/"+pkg ||
				strings.HasPrefix(dep, mod+"internal/sandbox") || strings.HasPrefix(dep, "github.com/hashicorp/terraform-exec") {
				t.Errorf("terraformer/%s links %s", pkg, dep)
			}
		}
	}
}
