package dockertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
)

// Importing the machine image (a Debian root filesystem, 270 MB in 11,700 files) into a new
// daemon cost 5 to 7 s of CPU (docker-untar, the layer's digest) and 10 to 20 s on a loaded
// host, and the suite starts some 40 daemons. So the image is imported once, into a template
// data root kept in the project's cache for this base image and this dockerd, and every new
// daemon's data root begins as a copy of it: the image's metadata copied, its layer linked
// (hard links: overlayfs never writes to a lower layer, and docker never changes a committed
// one; a daemon that removes the image removes only its links).

// templateDirs are what a template keeps of a data root: the image store's metadata and the
// overlay2 layers (with their l/ short links).
var templateDirs = []string{"image", "overlay2"}

// imageTemplate returns the template data root for $KLOUD_BASE_IMAGE and this dockerd, making
// it (a private daemon that imports the image, then stops) if it is not in the cache.
func imageTemplate(ctx context.Context) (string, error) {
	base := os.Getenv("KLOUD_BASE_IMAGE")
	ver, err := exec.Command("dockerd", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("dockertest: dockerd --version: %w", err)
	}
	sum := sha256.Sum256(append([]byte(base+"\n"), ver...))
	cache, err := testutil.CacheDir()
	if err != nil {
		return "", err
	}
	parent := filepath.Join(cache, "dockerimg")
	tpl := filepath.Join(parent, filepath.Base(base)+"-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(tpl, "ok")); err == nil {
		return tpl, nil
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("dockertest: image template: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-")
	if err != nil {
		return "", fmt.Errorf("dockertest: image template: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename; a failed attempt's
	d, err := start(ctx, Options{}, "")
	if err != nil {
		return "", fmt.Errorf("dockertest: image template: %w", err)
	}
	// Stop the daemon with its data in place, move what the template keeps, then clean up.
	d.Client.Close()
	d.Client = nil
	d.stop()
	var merr error
	if merr = unmountUnder(d.Dir); merr == nil {
		for _, name := range templateDirs {
			if merr = os.Rename(filepath.Join(d.Dir, "data", name), filepath.Join(tmp, name)); merr != nil {
				break
			}
		}
	}
	if err := d.Close(); err != nil && merr == nil {
		merr = err
	}
	if merr != nil {
		return "", fmt.Errorf("dockertest: image template: %w", merr)
	}
	if err := os.WriteFile(filepath.Join(tmp, "ok"), nil, 0o600); err != nil {
		return "", fmt.Errorf("dockertest: image template: %w", err)
	}
	if err := os.Rename(tmp, tpl); err != nil {
		// Another test process made it first: use theirs.
		if _, serr := os.Stat(filepath.Join(tpl, "ok")); serr != nil {
			return "", fmt.Errorf("dockertest: image template: %w", err)
		}
		return tpl, nil
	}
	// Templates of other base images or dockerd versions are of no more use.
	if es, err := os.ReadDir(parent); err == nil {
		for _, e := range es {
			p := filepath.Join(parent, e.Name())
			if fi, err := e.Info(); err == nil && p != tpl && (!strings.HasPrefix(e.Name(), ".tmp-") || time.Since(fi.ModTime()) > time.Hour) {
				os.RemoveAll(p) // a .tmp- of an hour ago: its process died
			}
		}
	}
	return tpl, nil
}

// seed makes data (a new daemon's data root) a copy of template tpl: the image metadata
// copied, the layers linked.
func seed(tpl, data string) error {
	if err := os.MkdirAll(data, 0o710); err != nil {
		return fmt.Errorf("dockertest: seed data root: %w", err)
	}
	for _, name := range templateDirs {
		args := []string{"-a", filepath.Join(tpl, name), filepath.Join(data, name)}
		if name == "overlay2" {
			args = append([]string{"--link"}, args...)
		}
		if out, err := exec.Command("cp", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("dockertest: seed data root: cp %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}
