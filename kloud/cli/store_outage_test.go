package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/store/storetest"
)

// TestCLIStoreOutage: with kloud's --mongo-url database gone, a CLI call fails fast (logged, with
// a generous bound) with the store-unavailable error and what to do, not "connection closed".
func TestCLIStoreOutage(t *testing.T) {
	t.Parallel()
	db := storetest.NewServer(t)
	_, run, must := startKloud(t, kloudtest.Options{MongoURL: db.URL})
	must(run("stack", "list"))
	db.Stop()
	start := time.Now()
	code, out, errOut := run("stack", "list")
	took := time.Since(start)
	t.Logf("stack list with the store down: exit %d after %v\n%s%s", code, took, out, errOut)
	if code == 0 || !strings.Contains(errOut, "store unavailable: ") ||
		!strings.Contains(errOut, "kloud's database does not answer") || strings.Contains(errOut, "connection closed") {
		t.Fatalf("stack list with the store down: exit %d\nstderr:\n%s", code, errOut)
	}
	if took > 8*time.Second {
		t.Errorf("stack list with the store down took %v", took)
	}
	db.Start()
	must(run("stack", "list"))
}
