package tfrun

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kloud-dev/kloud/internal/atomicfile"
)

// A preview (Request.Preview) is a plan of other files against a content id's state that
// leaves the content id as it was: kloud's stack.plan of a stack shows what an update would do
// without making terraformer hold the previewed files (with placeholder agent keys) in the
// stack's live directory, where a later destroy would run them. prepare keeps the stored files
// and variables (keepForPreview) before it writes the preview's; execute puts them back once
// the plan's result is read (restorePreviewed) and removes the preview's plan file.

// keptContent is a content id's stored files and variables before a preview replaced them.
type keptContent struct {
	files map[string][]byte
	vars  []byte // nil: there was no variables file
}

// keepForPreview reads the stored content files and variables of a preview's content id before
// prepare replaces them. It does nothing for other runs.
func (r *run) keepForPreview() error {
	if !r.req.Preview {
		return nil
	}
	names, err := contentFiles(r.work)
	if err != nil {
		return err
	}
	k := &keptContent{files: make(map[string][]byte, len(names))}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(r.work, n))
		if err != nil {
			return fmt.Errorf("preview: keep stored content: %w", err)
		}
		k.files[n] = b
	}
	b, err := os.ReadFile(r.varsPath())
	switch {
	case err == nil:
		k.vars = b
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("preview: keep stored variables: %w", err)
	}
	r.kept = k
	return nil
}

// restorePreviewed puts back what keepForPreview kept, and removes the preview's plan. A
// failure is logged: the next request with files replaces the content anyway.
func (r *run) restorePreviewed() {
	k := r.kept
	if k == nil {
		return
	}
	if err := r.putBack(k); err != nil {
		r.log.Error("preview: put the stored content back (the next apply replaces it)", "err", err)
		return
	}
	r.log.Info("preview: stored content put back", "files", len(k.files))
}

func (r *run) putBack(k *keptContent) error {
	if err := os.Remove(r.planPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := r.replaceContent(k.files); err != nil {
		return err
	}
	var err error
	if k.vars == nil {
		err = os.Remove(r.varsPath())
		if errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	} else {
		err = atomicfile.WriteFile(r.varsPath(), k.vars, 0o600)
	}
	if err != nil {
		return err
	}
	return r.giveToSandbox() // terraform's user reads them in the next run (a destroy brings no files)
}
