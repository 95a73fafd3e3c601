package docker

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Snapshots are offered only for an overlay2 daemon whose data root is readable here.
func TestCheckLayers(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, sub := range []string{"overlay2", "containers"} {
		if err := os.Mkdir(filepath.Join(root, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkLayers("overlay2", root); err != nil {
		t.Fatalf("an overlay2 data root here: %v", err)
	}
	for name, c := range map[string]struct{ driver, root string }{
		"vfs":           {"vfs", root},
		"fuse":          {"fuse-overlayfs", root},
		"relative root": {"overlay2", "var/lib/docker"},
		"absent root":   {"overlay2", filepath.Join(root, "absent")},
		"no containers": {"overlay2", filepath.Join(root, "overlay2")},
	} {
		err := checkLayers(c.driver, c.root)
		if !errors.Is(err, errLayersNotHere) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
