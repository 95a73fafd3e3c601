package docker_test

import (
	"os"
	"testing"

	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain makes this test binary terraform's sandbox launcher (tfrun re-executes it, in the
// conformance suite).
func TestMain(m *testing.M) {
	tfsandbox.MaybeRun()
	os.Exit(m.Run())
}
