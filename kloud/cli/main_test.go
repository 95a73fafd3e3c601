package cli_test

import (
	"os"
	"testing"

	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain makes this test binary terraform's sandbox launcher (tfrun re-executes it): the tf and
// credential tests run a real terraformer in-process.
func TestMain(m *testing.M) {
	tfsandbox.MaybeRun()
	os.Exit(m.Run())
}
