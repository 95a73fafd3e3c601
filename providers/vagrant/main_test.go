package vagrant_test

import (
	"os"
	"testing"

	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain makes this test binary terraform's sandbox launcher (tfrun re-executes it) and removes
// the kloudvagrant mirror at the end.
func TestMain(m *testing.M) {
	tfsandbox.MaybeRun()
	code := m.Run()
	tfprovidertest.Cleanup()
	os.Exit(code)
}
