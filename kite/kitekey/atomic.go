package kitekey

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kloud-dev/kloud/internal/atomicfile"
)

// writeAtomic replaces path by data with mode perm (internal/atomicfile: a synced temporary file
// beside it renamed over it, then the directory synced), creating the directory (0700) if
// missing.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return atomicfile.WriteFile(path, data, perm)
}
