// Package atomicfile replaces a file atomically and durably, the one way kloud does it (kite
// keys in kite/kitekey, terraformer's state, lease and hash files in terraformer/tfrun, snapshot
// files in internal/layersnap): what is written goes to a temporary file beside the target (the
// same directory, so the same filesystem: ".<name>.tmp-<random>", made by os.CreateTemp with
// mode 0600), which is given its mode, flushed (fsync), renamed over the target, and then the
// directory is flushed. Readers see the old content or the new one, never a part; a target that
// is a symlink is replaced, never followed. After a crash the target holds the old or the new
// content, and a temporary file may be left beside it: RemoveTemps removes those.
//
// Start reading at WriteFile (the content in memory) and Create (a stream: write into the File,
// then Commit; a deferred Cleanup removes the temporary file unless it was committed). The
// directory must exist.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// WriteFile replaces path by data with mode perm (not subject to the umask).
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Commit()
}

// File is the temporary file of a replacement of its target under way: write into it, then
// Commit. It is not safe for concurrent use.
type File struct {
	*os.File
	path string
	perm fs.FileMode
	done bool // committed, or its temporary file removed
}

// Create starts replacing path (mode perm once committed) with a temporary file beside it.
func Create(path string, perm fs.FileMode) (*File, error) {
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix(path)+"*")
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return &File{File: f, path: path, perm: perm}, nil
}

// Commit gives the temporary file its mode, flushes and closes it, renames it over the target
// and flushes the directory. On an error before the rename the target is unchanged and the
// temporary file removed; an error of the directory's flush comes after the target was replaced.
func (f *File) Commit() error {
	if f.done {
		return fmt.Errorf("write %s: already committed or cleaned up", f.path)
	}
	f.done = true
	err := f.Chmod(f.perm)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.File.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), f.path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := syncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("write %s: flush the directory: %w", f.path, err)
	}
	return nil
}

// Cleanup closes and removes the temporary file unless Commit ran; it is meant for a defer.
func (f *File) Cleanup() {
	if f.done {
		return
	}
	f.done = true
	f.File.Close()
	os.Remove(f.Name())
}

// RemoveTemps removes the temporary files that interrupted replacements of path left beside it
// (only path's own: ".<name>.tmp-…"). None is no error.
func RemoveTemps(path string) error {
	dir, prefix := filepath.Dir(path), tempPrefix(path)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove temporary files of %s: %w", path, err)
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove temporary files of %s: %w", path, err)
	}
	return nil
}

func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
