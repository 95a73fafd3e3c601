package ptype_test

import (
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// TestStandardLibraryOnly keeps ptype a leaf: kloud/api and kloud/model link it, so whatever it
// imports every client of kloud links too. Only the standard library (an import path whose first
// element has no dot) is allowed.
func TestStandardLibraryOnly(t *testing.T) {
	const self = "github.com/kloud-dev/kloud/provider/ptype"
	for _, dep := range testutil.Deps(t, "./provider/ptype") {
		if dep != self && strings.Contains(strings.SplitN(dep, "/", 2)[0], ".") {
			t.Errorf("provider/ptype links %s: it may import only the standard library", dep)
		}
	}
}
