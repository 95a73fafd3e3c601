package e2e

// TestLayers keeps the module's layers: no package imports one of a layer above its own. Every
// package of the module counts, test harnesses (kontroltest, dockertest, e2e/providertest, ...)
// included; only _test.go files, which are the top of whatever they test, may reach up.

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// layers ranks the module's packages, lowest first; a package takes the rank of the longest
// prefix that names it (its path or a parent of it), and may import packages of its own rank or
// below. Packages of one rank are peers; which of them may link which is for the packages' own
// dependency tests (klient/deps_test.go, provider/deps_test.go, kloud/deps_test.go).
var layers = map[string]int{
	"internal": 0, "userdata": 0, // helpers that know nothing of Kloud
	"kite": 1, "internal/logfmt": 1, "internal/metrics": 1, // the transport, and helpers that use its errors
	"kontrol/kontrolapi": 2, "klient/klientapi": 2, // wire types
	"provider/ptype": 2, "provider/pluginapi": 2, // the provider contract's value types, the plugin protocol
	"kontrol": 3, "klient": 3, "provider": 3, // the registry, the agent, the provider contract
	"providers": 4, "examples": 4, "terraformer": 4, // providers, and what runs terraform with them
	"objstore": 4,                       // the S3 server of buckets and its provisioner
	"kloud":    5,                       // the orchestrator
	"cmd":      6, "e2e": 6, "bench": 6, // mains and the harnesses that run the whole system
	"load":  6, // the load suite (make load)
	"chaos": 6, // the fault suite
}

const module = "github.com/kloud-dev/kloud/"

// layerOf returns the rank of p (a path inside the module) and the prefix that gave it.
func layerOf(p string) (int, string, bool) {
	for q := p; q != "."; {
		if r, ok := layers[q]; ok {
			return r, q, true
		}
		i := strings.LastIndex(q, "/")
		if i < 0 {
			break
		}
		q = q[:i]
	}
	return 0, "", false
}

func TestLayers(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs, edges := 0, 0
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		from := strings.TrimPrefix(f[0], module)
		rf, lf, ok := layerOf(from)
		if !ok {
			t.Errorf("%s has no layer: add its top-level directory to layers", from)
			continue
		}
		pkgs++
		for _, imp := range f[1:] {
			to, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			edges++
			rt, lt, ok := layerOf(to)
			if !ok {
				t.Errorf("%s has no layer: add its top-level directory to layers", to)
				continue
			}
			if rt > rf {
				t.Errorf("%s (%s, layer %d) imports %s (%s, layer %d), a layer above it", from, lf, rf, to, lt, rt)
			}
		}
	}
	if pkgs < 50 || edges < 100 {
		t.Fatalf("go list gave only %d packages and %d imports", pkgs, edges)
	}
}
