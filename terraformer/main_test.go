package terraformer_test

import (
	"os"
	"testing"

	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain: the test binary is terraform's sandbox launcher for the in-process engines.
func TestMain(m *testing.M) {
	tfsandbox.MaybeRun()
	code := m.Run()
	tfsandbox.RemoveTestLeftovers() // the groups of the runs its tests killed
	os.Exit(code)
}
