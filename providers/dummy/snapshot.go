package dummy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

// Snapshots (provider.Snapshotter), so kloud's snapshot jobs are tested without root: a dummy
// machine's "disk" is the regular files at the top of its root directory (where the conformance
// suite's WriteFile writes; the agent keeps its own files in subdirectories, which a snapshot
// neither saves nor restores: they are the machine's identity). A snapshot is a copy of them in
// Dir/.snapshots/<id>; Restore replaces the machine's top-level files by the snapshot's.

func (d *dummy) snapshotDir(id string) string { return filepath.Join(d.o.Dir, ".snapshots", id) }

func (m *machine) stopped() error {
	if _, alive := machinePID(m.root(), userdata.SupervisorPIDPath); alive {
		return fmt.Errorf("dummy: machine %s: %w", m.b.Label, provider.ErrRunning)
	}
	if _, err := os.Stat(m.root()); err != nil {
		return fmt.Errorf("dummy: machine %s: %w", m.b.Label, err)
	}
	return nil
}

// Snapshot copies the stopped machine's top-level files.
func (m *machine) Snapshot(ctx context.Context, id string) (provider.SnapshotInfo, error) {
	if err := provider.SnapshotIDOK(id); err != nil {
		return provider.SnapshotInfo{}, err
	}
	if err := m.d.fail("Snapshot"); err != nil {
		return provider.SnapshotInfo{}, err
	}
	if err := m.stopped(); err != nil {
		return provider.SnapshotInfo{}, err
	}
	dst := m.d.snapshotDir(id)
	tmp := dst + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return provider.SnapshotInfo{}, fmt.Errorf("dummy: snapshot: %w", err)
	}
	size, err := copyTop(m.root(), tmp)
	if err == nil {
		os.RemoveAll(dst)
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return provider.SnapshotInfo{}, fmt.Errorf("dummy: snapshot %s: %w", m.b.Label, err)
	}
	return provider.SnapshotInfo{Size: size, DiskSize: size, Format: "files"}, nil
}

// Restore replaces the stopped machine's top-level files by the snapshot's.
func (m *machine) Restore(ctx context.Context, id string) error {
	if err := provider.SnapshotIDOK(id); err != nil {
		return err
	}
	if err := m.stopped(); err != nil {
		return err
	}
	src := m.d.snapshotDir(id)
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("dummy: snapshot %s: %w", id, err)
	}
	ents, err := os.ReadDir(m.root())
	if err != nil {
		return fmt.Errorf("dummy: restore %s: %w", m.b.Label, err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(m.root(), e.Name())); err != nil {
				return fmt.Errorf("dummy: restore %s: %w", m.b.Label, err)
			}
		}
	}
	if _, err := copyTop(src, m.root()); err != nil {
		return fmt.Errorf("dummy: restore %s: %w", m.b.Label, err)
	}
	return nil
}

// DeleteSnapshot removes the snapshot's copy.
func (m *machine) DeleteSnapshot(ctx context.Context, id string) error {
	if err := provider.SnapshotIDOK(id); err != nil {
		return err
	}
	if err := os.RemoveAll(m.d.snapshotDir(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("dummy: delete snapshot %s: %w", id, err)
	}
	return nil
}

// copyTop copies the regular files at the top of src into dst and returns their total size.
func copyTop(src, dst string) (int64, error) {
	ents, err := os.ReadDir(src)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return 0, err
		}
		fi, err := e.Info()
		if err != nil {
			return 0, err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, fi.Mode().Perm()); err != nil {
			return 0, err
		}
		n += int64(len(b))
	}
	return n, nil
}

var _ provider.Snapshotter = (*machine)(nil)
