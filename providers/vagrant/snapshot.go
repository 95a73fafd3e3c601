package vagrant

import (
	"context"
	"fmt"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/provider"
)

// Snapshots (provider.Snapshotter): kept by the machine's host (klient --vagrant,
// vagrant.snapshot.*; package klient/vagrant, snapshot.go). A docker machine's snapshot is its
// container's writable layer, archived on the host; a box machine's is `vagrant snapshot` of it.
// The size the host reports counts against the owner's quota. The host decides whether it can
// (a Docker daemon with overlay2 on that host, klient as root; a box provider with snapshots) and
// says why not (-32005) otherwise: kloud advertises the capability for every vagrant host,
// because which host builds a machine is only known at its build.
//
// A snapshot stays on the host it was taken on: restoring it into a machine of another host of
// the owner is refused by that host (it has no such snapshot).

// Snapshot saves the halted machine's disk on its host as snapID.
func (m *machine) Snapshot(ctx context.Context, snapID string) (provider.SnapshotInfo, error) {
	var sn klientapi.VagrantSnapshot
	if err := m.snapshotOp(ctx, klientapi.MethodVagrantSnapshotSave, snapID, &sn); err != nil {
		return provider.SnapshotInfo{}, err
	}
	return provider.SnapshotInfo{Size: sn.Size, DiskSize: sn.DiskSize, Format: sn.Format}, nil
}

// Restore replaces the halted machine's disk by snapshot snapID's (taken on the same host).
func (m *machine) Restore(ctx context.Context, snapID string) error {
	return m.snapshotOp(ctx, klientapi.MethodVagrantSnapshotRestore, snapID, nil)
}

// DeleteSnapshot removes snapshot snapID from the host of the machine it was taken of (which may
// be destroyed by now).
func (m *machine) DeleteSnapshot(ctx context.Context, snapID string) error {
	return m.snapshotOp(ctx, klientapi.MethodVagrantSnapshotDelete, snapID, nil)
}

func (m *machine) snapshotOp(ctx context.Context, method, snapID string, result any) error {
	if err := provider.SnapshotIDOK(snapID); err != nil {
		return fmt.Errorf("%w: %w", err, kite.ErrInvalidParams)
	}
	if m.gone && method != klientapi.MethodVagrantSnapshotDelete {
		return m.goneErr()
	}
	h, err := m.v.hosts.Host(ctx, m.rec.Owner, m.rec.Host)
	if err != nil {
		return fmt.Errorf("vagrant machine %s: %w", m.b.Label, err)
	}
	p := klientapi.VagrantSnapshotParams{Token: h.Token, Name: m.rec.Name, Snapshot: snapID}
	if err := m.v.call(ctx, h, method, p, result); err != nil {
		return fmt.Errorf("vagrant machine %s: %w", m.b.Label, err)
	}
	return nil
}

var _ provider.Snapshotter = (*machine)(nil)
