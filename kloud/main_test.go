package kloud_test

import (
	"os"
	"testing"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestMain makes this test binary terraform's sandbox launcher (tfrun re-executes it): the
// flow tests run a real terraformer in-process.
func TestMain(m *testing.M) {
	sandbox.MaybeRunInit() // local machines boot from this binary (declare_test.go)
	tfsandbox.MaybeRun()
	code := m.Run()
	tfprovidertest.Cleanup() // the kloudlocal provider mirror (declare_test.go)
	os.Exit(code)
}
