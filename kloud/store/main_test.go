package store_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a closed store leaves goroutines behind (FerretDB, driver
// monitors, watchers).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
