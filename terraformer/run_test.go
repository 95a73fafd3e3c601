package terraformer_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/terraformer"
)

func TestRunNeedsCLIConfig(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "terraform.tfrc")
	err := terraformer.Run(t.Context(), terraformer.Config{Addr: "127.0.0.1:0", DataDir: t.TempDir(), CLIConfigFile: missing})
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "--cli-config") {
		t.Fatalf("Run without a CLI config: %v", err)
	}
}
