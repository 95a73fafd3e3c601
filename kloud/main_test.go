package kloud_test

import (
	"os"
	"testing"

	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain makes this test binary terraform's sandbox launcher (tfrun re-executes it): the
// flow tests run a real terraformer in-process.
func TestMain(m *testing.M) {
	tfsandbox.MaybeRun()
	os.Exit(m.Run())
}
