package cli

import (
	"bytes"
	"github.com/kloud-dev/kloud/internal/testutil"
	"os"
	"strings"
	"testing"
)

// TestTerraformerSupervisor: the terraformer kloud serve starts is supervised by
// internal/supervise under the name "terraformer" (its own tests check restarts and backoff): a
// binary that exits at once (this test binary refuses terraformer's flags) is an error of Start
// that names it.
func TestTerraformerSupervisor(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	g := &globals{dataDir: t.TempDir(), stdout: &bytes.Buffer{}, stderr: &stderr}
	f := &serveFlags{terraformerBin: os.Args[0], terraformerAddr: testutil.FreeLoopback(t), logFormat: "text"}
	f.o.Addr = "127.0.0.1:7000"
	sup, err := newTerraformerSupervisor(g, f, nil, 0, f.terraformerAddr)
	if err != nil {
		t.Fatal(err)
	}
	if sup.Name != "terraformer" || sup.URL != "http://"+f.terraformerAddr {
		t.Fatalf("supervisor %q at %q", sup.Name, sup.URL)
	}
	err = sup.Start(t.Context())
	if err == nil || !strings.HasPrefix(err.Error(), "terraformer (pid ") || !strings.Contains(err.Error(), "exited at start (exit status 2); see its output") {
		t.Fatalf("Start: %v", err)
	}
	sup.Stop()
	if !strings.Contains(stderr.String(), "terraformer: flag provided but not defined") {
		t.Errorf("its output, prefixed, not on stderr:\n%s", stderr.String())
	}
}
