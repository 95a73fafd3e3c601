package tfsandbox_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kloud-dev/kloud/terraformer/tfsandbox"
)

// TestCLIConfigPaths: the filesystem mirrors and plugin cache a CLI config names, those that
// exist, plus where symlinks in a mirror point outside it; commented-out settings do not count.
func TestCLIConfigPaths(t *testing.T) {
	t.Parallel()
	mirror, cache, build := t.TempDir(), t.TempDir(), t.TempDir()
	provider := filepath.Join(build, "terraform-provider-x")
	if err := os.WriteFile(provider, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(provider, filepath.Join(mirror, "terraform-provider-x_v1.0.0")); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "terraform.tfrc")
	err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
provider_installation {
  filesystem_mirror {
    path    = %q
    include = ["registry.terraform.io/*/*"]
  }
  filesystem_mirror {
    path = "/nonexistent/mirror"
  }
  # filesystem_mirror { path = "/etc/commented" }
  direct { exclude = ["registry.terraform.io/*/*"] }
}
plugin_cache_dir = %q
`, mirror, cache)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tfsandbox.CLIConfigPaths(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{mirror, provider, cache}
	if !slices.Equal(got, want) {
		t.Fatalf("CLIConfigPaths: %v, want %v", got, want)
	}
}
