package sandbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/internal/layersnap"
)

// A snapshot of another base image is refused with a message naming both images, the disk
// untouched. (What layersnap refuses in a stream is tested there.)
func TestRestoreRefusesOtherBase(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := layersnap.Save(t.Context(), src, &b, layersnap.SaveOptions{Meta: map[string]string{metaBaseImage: "/other"}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	upper := filepath.Join(dir, "upper")
	if err := os.Mkdir(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	err := restoreLayer(t.Context(), &b, upper, filepath.Join(dir, "work"), "/base")
	if err == nil || !strings.Contains(err.Error(), "/other") || !strings.Contains(err.Error(), "/base") || !errors.Is(err, layersnap.ErrMismatch) {
		t.Fatalf("another base image: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("left beside the disk: %v", ents)
	}
}
