package local

import (
	"context"
	"errors"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// Snapshots (provider.Snapshotter): the machine's disk, its overlay upper dir, saved while the
// machine is stopped as a compressed archive in the provider's state dir
// (StateDir/.snapshots/<id>.tar.zst; sandbox.Manager.SaveDisk), and restored by unpacking it
// beside the upper dir and swapping the two atomically (RestoreDisk). A snapshot may be restored
// into any local machine made over the same base image; the machine keeps its own identity
// (agent key, cloud-init seed, machine-id). Snapshots outlive the machine they were taken of.
// Machines with disk_mb work the same: their upper dir is inside the disk image, mounted in a
// private mount namespace while the machine is stopped (sandbox/snapshot_disk.go), so the
// restore stays atomic and within the quota.

// SnapshotFormat is what SnapshotInfo.Format says of local snapshots.
const SnapshotFormat = "tar+zstd"

func (m *machine) snapshotErr(op string, err error) error {
	switch {
	case errors.Is(err, sandbox.ErrRunning):
		return fmt.Errorf("%s local machine %s (%s): %w", op, m.b.Label, m.id, provider.ErrRunning)
	case errors.Is(err, sandbox.ErrSnapshotNotFound):
		return fmt.Errorf("%s local machine %s (%s): %w: %w", op, m.b.Label, m.id, err, kite.ErrNotFound)
	}
	return m.wrap(op, err)
}

// Snapshot saves the stopped machine's disk as snapID.
func (m *machine) Snapshot(ctx context.Context, snapID string) (provider.SnapshotInfo, error) {
	if err := provider.SnapshotIDOK(snapID); err != nil {
		return provider.SnapshotInfo{}, fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	s, err := m.m.SaveDisk(ctx, m.id, snapID)
	if err != nil {
		return provider.SnapshotInfo{}, m.snapshotErr("snapshot", err)
	}
	return provider.SnapshotInfo{Size: s.Size, DiskSize: s.DiskSize, Format: SnapshotFormat}, nil
}

// Restore replaces the stopped machine's disk by snapshot snapID's.
func (m *machine) Restore(ctx context.Context, snapID string) error {
	if err := provider.SnapshotIDOK(snapID); err != nil {
		return fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	if err := m.m.RestoreDisk(ctx, m.id, snapID); err != nil {
		return m.snapshotErr("restore", err)
	}
	return nil
}

// DeleteSnapshot removes snapshot snapID (whichever local machine it was taken of).
func (m *machine) DeleteSnapshot(ctx context.Context, snapID string) error {
	if err := provider.SnapshotIDOK(snapID); err != nil {
		return fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	if err := m.m.DeleteSnapshot(ctx, snapID); err != nil {
		return m.wrap("delete snapshot of", err)
	}
	return nil
}

var _ provider.Snapshotter = (*machine)(nil)
