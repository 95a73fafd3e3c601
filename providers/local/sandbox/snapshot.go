package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kloud-dev/kloud/internal/layersnap"
)

// Snapshots of a machine's disk (its overlay upper dir), for the local provider's
// provider.Snapshotter.
//
// A snapshot is one file, StateDir/.snapshots/<snapID>.tar.zst (a name GC never takes for a
// machine: ids do not start with a dot): an internal/layersnap stream of the upper dir (a PAX tar,
// zstd-compressed, with owners, modes, xattrs, whiteouts, hard links) whose header names the base
// image the upper dir was made over (metadata "baseImage") and the machine ("machine"): an upper
// dir is only valid over its own lower, so RestoreDisk refuses a snapshot of another base image.
//
// Both need the machine stopped (ErrRunning otherwise) and hold its lock, so it cannot start
// meanwhile. A machine with a disk quota keeps its upper dir inside its ext4 image: both mount
// the image in a private mount namespace for the time of the operation (snapshot_disk.go). SaveDisk writes a temporary file and renames it; RestoreDisk unpacks into a fresh
// directory beside the upper dir and swaps the two with one renameat2(RENAME_EXCHANGE)
// (layersnap.Restore): a crash leaves the old disk or the new one, never a mix. The restored disk keeps the target machine's
// identity (IdentityFiles: its machine-id, cloud-init seed and agent key), so a snapshot of one
// machine restored into another boots as that other machine (cloud-init sees its instance-id and
// runs its per-instance modules again, as a cloud image does on a new instance).

// ErrRunning is returned (wrapped) by SaveDisk and RestoreDisk of a running machine.
var ErrRunning = errors.New("sandbox: machine is running (stop it first)")

// ErrSnapshotNotFound is returned (wrapped) by RestoreDisk of a snapshot that does not exist.
var ErrSnapshotNotFound = errors.New("sandbox: snapshot not found")

// SnapshotFormat is the format of the files SaveDisk writes.
const SnapshotFormat = layersnap.Format

// Snapshot metadata keys (layersnap.SaveOptions.Meta).
const (
	metaBaseImage = "baseImage"
	metaMachine   = "machine"
)

// IdentityFiles are the files of the upper dir (relative paths) that make a machine itself
// rather than its content; RestoreDisk keeps the target's.
var IdentityFiles = []string{
	"etc/machine-id",
	"etc/kloud/kite.key",
	"etc/cloud/cloud.cfg.d/90-kloud-seed.cfg",
	"var/lib/cloud/seed/nocloud/meta-data",
	"var/lib/cloud/seed/nocloud/user-data",
}

// DiskSnapshot describes a saved snapshot.
type DiskSnapshot struct {
	ID   string
	Path string
	// Size is the file's size; DiskSize the bytes of regular files saved (uncompressed).
	Size, DiskSize int64
	Files          int
}

// SnapshotPath is where snapshot snapID is kept.
func (m *Manager) SnapshotPath(snapID string) string {
	return filepath.Join(m.stateDir, ".snapshots", snapID+".tar.zst")
}

func validSnapID(id string) error {
	if !idRE.MatchString(id) || strings.Contains(id, ".") {
		return fmt.Errorf("snapshot id %q: want 1-64 characters of [A-Za-z0-9_-], not starting with _ or -", id)
	}
	return nil
}

// SaveDisk saves the disk of stopped machine id as snapshot snapID (replacing one of that id).
func (m *Manager) SaveDisk(ctx context.Context, id, snapID string) (DiskSnapshot, error) {
	if err := validSnapID(snapID); err != nil {
		return DiskSnapshot{}, err
	}
	l, r, err := m.lockRecord(ctx, id, "snapshot machine")
	if err != nil {
		return DiskSnapshot{}, err
	}
	defer l.unlock()
	if alive(r.PID, r.PIDStart) {
		return DiskSnapshot{}, fmt.Errorf("snapshot machine %q: %w", id, ErrRunning)
	}
	dst := m.SnapshotPath(snapID)
	out := DiskSnapshot{ID: snapID, Path: dst}
	err = m.withDisk(r, true, func(root string) error { // snapshot_disk.go
		info, err := layersnap.SaveFile(ctx, filepath.Join(root, "upper"), dst, layersnap.SaveOptions{
			Meta: map[string]string{metaBaseImage: r.BaseImage, metaMachine: r.ID},
		})
		out.Size, out.DiskSize, out.Files = info.Size, info.DiskSize, info.Files
		return err
	})
	if err != nil {
		return DiskSnapshot{}, fmt.Errorf("snapshot machine %q: %w", id, err)
	}
	m.log.Info("machine disk saved", "machine", id, "snapshot", snapID, "size", out.Size, "disk", out.DiskSize, "files", out.Files)
	return out, nil
}

// DeleteSnapshot removes snapshot snapID (and what an interrupted SaveDisk of it left). A
// missing snapshot is not an error.
func (m *Manager) DeleteSnapshot(ctx context.Context, snapID string) error {
	if err := validSnapID(snapID); err != nil {
		return err
	}
	if err := layersnap.RemoveFile(m.SnapshotPath(snapID)); err != nil {
		return fmt.Errorf("delete snapshot %q: %w", snapID, err)
	}
	return nil
}

// Snapshots lists the ids of the snapshots kept in the state dir.
func (m *Manager) Snapshots() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(m.stateDir, ".snapshots"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var out []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".tar.zst"); ok && validSnapID(id) == nil {
			out = append(out, id)
		}
	}
	return out, nil
}

// RestoreDisk replaces the disk of stopped machine id by snapshot snapID's, keeping the
// machine's IdentityFiles. The swap is atomic; on error the disk is unchanged.
func (m *Manager) RestoreDisk(ctx context.Context, id, snapID string) error {
	if err := validSnapID(snapID); err != nil {
		return err
	}
	l, r, err := m.lockRecord(ctx, id, "restore machine")
	if err != nil {
		return err
	}
	defer l.unlock()
	if alive(r.PID, r.PIDStart) {
		return fmt.Errorf("restore machine %q: %w", id, ErrRunning)
	}
	f, err := os.Open(m.SnapshotPath(snapID))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("restore machine %q from snapshot %q: %w", id, snapID, ErrSnapshotNotFound)
	}
	if err != nil {
		return fmt.Errorf("restore machine %q: %w", id, err)
	}
	defer f.Close()
	err = m.withDisk(r, false, func(root string) error { // snapshot_disk.go
		return restoreLayer(ctx, f, filepath.Join(root, "upper"), filepath.Join(root, "work"), r.BaseImage)
	})
	if err != nil {
		return fmt.Errorf("restore machine %q from snapshot %q: %w", id, snapID, err)
	}
	m.log.Info("machine disk restored", "machine", id, "snapshot", snapID)
	return nil
}

// restoreLayer restores the snapshot stream r into the upper dir over base image base, keeping
// the IdentityFiles of the current one and emptying the overlay's work dir.
func restoreLayer(ctx context.Context, r io.Reader, upper, work, base string) error {
	err := layersnap.Restore(ctx, r, upper, layersnap.RestoreOptions{
		Match:     map[string]string{metaBaseImage: base},
		KeepPaths: IdentityFiles,
		LowerDir:  base,
		WorkDir:   work,
	})
	if me := (*layersnap.MismatchError)(nil); errors.As(err, &me) && me.Key == metaBaseImage {
		return fmt.Errorf("the snapshot's disk was made over base image %s, this machine runs on %s: restore it into a machine of the same image: %w", me.Have, me.Want, layersnap.ErrMismatch)
	}
	return err
}
