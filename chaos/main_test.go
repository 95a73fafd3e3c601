package chaos

import (
	"fmt"
	"os"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider/tfprovidertest"
	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// bins are the binaries the worlds run, built from this tree once (testutil's cache).
type bins struct{ kloud, klient, terraformer string }

// built is set once by TestMain before any test runs and only read after.
var built bins

func TestMain(m *testing.M) {
	sandbox.MaybeRunInit() // first: the local machines boot from this binary
	var err error
	for _, b := range []struct {
		dst *string
		pkg string
	}{{&built.kloud, "./cmd/kloud"}, {&built.klient, "./cmd/klient"}, {&built.terraformer, "./cmd/terraformer"}} {
		if *b.dst, err = testutil.CachedBinary(b.pkg); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", b.pkg, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	tfprovidertest.Cleanup()
	tfsandbox.RemoveTestLeftovers() // the groups of the runs its faults killed
	os.Exit(code)
}
