package klient

import (
	"context"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
)

// vagrant.snapshot.*: snapshots of the vagrant host's machines (package klient/vagrant,
// snapshot.go does the work). Like vagrant.up, save and restore run detached from the caller:
// an archive or a swap cut in the middle by a dropped link is what they must never leave.
func (kl *Klient) handleVagrantSnapshots() {
	kl.kite.Handle(klientapi.MethodVagrantSnapshotSave, kite.Typed(kl.vagrantSnapshotSave))
	kl.kite.Handle(klientapi.MethodVagrantSnapshotRestore, kite.Typed(kl.vagrantSnapshotRestore))
	kl.kite.Handle(klientapi.MethodVagrantSnapshotDelete, kite.Typed(kl.vagrantSnapshotDelete))
}

func (kl *Klient) vagrantSnapshotSave(ctx context.Context, r *kite.Request, p *klientapi.VagrantSnapshotParams) (any, error) {
	if err := kl.ownerOnly(ctx, r, p.Token); err != nil {
		return nil, err
	}
	ctx, cancel := kl.detached(ctx)
	defer cancel()
	sn, err := kl.vagrant.SnapshotSave(ctx, p.Name, p.Snapshot)
	return sn, vagrantErr(err)
}

func (kl *Klient) vagrantSnapshotRestore(ctx context.Context, r *kite.Request, p *klientapi.VagrantSnapshotParams) (any, error) {
	if err := kl.ownerOnly(ctx, r, p.Token); err != nil {
		return nil, err
	}
	ctx, cancel := kl.detached(ctx)
	defer cancel()
	return struct{}{}, vagrantErr(kl.vagrant.SnapshotRestore(ctx, p.Name, p.Snapshot))
}

func (kl *Klient) vagrantSnapshotDelete(ctx context.Context, r *kite.Request, p *klientapi.VagrantSnapshotParams) (any, error) {
	if err := kl.ownerOnly(ctx, r, p.Token); err != nil {
		return nil, err
	}
	return struct{}{}, vagrantErr(kl.vagrant.SnapshotDelete(ctx, p.Name, p.Snapshot))
}
