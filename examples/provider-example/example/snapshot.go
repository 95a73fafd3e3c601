package example

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// Snapshots (capability "snapshot", provider.Snapshotter): a machine's disk here is its owner's
// home directory (<disk>/home/<owner>); a snapshot is a copy of it in <state>/snapshots/<id>,
// taken and restored while the machine is stopped (kloud stops a running machine first and
// starts it again after). Restore copies the snapshot beside the home directory and swaps the
// two, so a failure leaves the home as it was. The agent's files (its key, its binary) live
// outside the home: a machine restored from another machine's snapshot stays itself.

func (e *example) snapshotDir(id string) string { return filepath.Join(e.o.Dir, "snapshots", id) }

func (m *machine) home() string { return filepath.Join(m.dir(), "home", m.b.Owner) }

// stopped fails with provider.ErrRunning while the machine's agent runs.
func (m *machine) stopped() error {
	if !plugin.ValidName(m.b.StackID) || !plugin.ValidName(m.b.Label) || !plugin.ValidName(m.b.Owner) {
		return fmt.Errorf("example: machine %q of stack %q: not a machine of this provider", m.b.Label, m.b.StackID)
	}
	if supervisor(m.dir()) > 0 {
		return fmt.Errorf("example: machine %s: %w", m.b.Label, provider.ErrRunning)
	}
	return nil
}

// Snapshot copies the stopped machine's home directory.
func (m *machine) Snapshot(ctx context.Context, id string) (provider.SnapshotInfo, error) {
	if err := provider.SnapshotIDOK(id); err != nil {
		return provider.SnapshotInfo{}, err
	}
	defer m.e.lock(m.dir())()
	if err := m.stopped(); err != nil {
		return provider.SnapshotInfo{}, err
	}
	dst := m.e.snapshotDir(id)
	tmp := dst + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return provider.SnapshotInfo{}, fmt.Errorf("example: snapshot %s: %w", m.b.Label, err)
	}
	size, err := copyTree(m.home(), tmp)
	if err == nil {
		os.RemoveAll(dst)
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return provider.SnapshotInfo{}, fmt.Errorf("example: snapshot %s: %w", m.b.Label, err)
	}
	return provider.SnapshotInfo{Size: size, DiskSize: size, Format: "directory"}, nil
}

// Restore replaces the stopped machine's home directory by the snapshot's.
func (m *machine) Restore(ctx context.Context, id string) error {
	if err := provider.SnapshotIDOK(id); err != nil {
		return err
	}
	defer m.e.lock(m.dir())()
	if err := m.stopped(); err != nil {
		return err
	}
	src := m.e.snapshotDir(id)
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("example: snapshot %s: %w", id, err)
	}
	home := m.home()
	next, old := home+".restore", home+".old"
	os.RemoveAll(next)
	os.RemoveAll(old)
	if _, err := copyTree(src, next); err != nil {
		os.RemoveAll(next)
		return fmt.Errorf("example: restore %s: %w", m.b.Label, err)
	}
	if err := os.Rename(home, old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		os.RemoveAll(next)
		return fmt.Errorf("example: restore %s: %w", m.b.Label, err)
	}
	if err := os.Rename(next, home); err != nil {
		os.Rename(old, home)
		return fmt.Errorf("example: restore %s: %w", m.b.Label, err)
	}
	return os.RemoveAll(old)
}

// DeleteSnapshot removes the snapshot's copy.
func (m *machine) DeleteSnapshot(ctx context.Context, id string) error {
	if err := provider.SnapshotIDOK(id); err != nil {
		return err
	}
	if err := os.RemoveAll(m.e.snapshotDir(id)); err != nil {
		return fmt.Errorf("example: delete snapshot %s: %w", id, err)
	}
	return nil
}

// copyTree copies the directories and regular files under src (symlinks and the rest are left
// out) to dst, which must not exist, and returns the bytes copied.
func copyTree(src, dst string) (int64, error) {
	var n int64
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(to, info.Mode().Perm())
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n += int64(len(b))
			return os.WriteFile(to, b, info.Mode().Perm())
		}
		return nil
	})
	return n, err
}

var _ provider.Snapshotter = (*machine)(nil)
