package api

import (
	"context"
	"errors"
	"fmt"
	"unicode"

	"github.com/kloud-dev/kloud/kloud/model"
)

// Snapshots (machine.snapshot, machine.snapshots, machine.restore, snapshot.delete): a machine's
// disk saved by its provider (capability "snapshot"), listed per user with its size and time,
// counted against a per-user quota.

// SnapshotParams are the params of machine.snapshot.
type SnapshotParams struct {
	MachineID string `json:"machineId"`
	// Name is the owner's name for it (default: the machine's label and the time).
	Name string `json:"name,omitempty"`
}

// SnapshotNameMax bounds a snapshot's name.
const SnapshotNameMax = 100

// Validate implements kite.Validator.
func (p *SnapshotParams) Validate() error {
	if err := required("machineId", p.MachineID); err != nil {
		return err
	}
	return validSnapshotName(p.Name)
}

func validSnapshotName(n string) error {
	if len(n) > SnapshotNameMax {
		return fmt.Errorf("name: at most %d bytes", SnapshotNameMax)
	}
	for _, r := range n {
		if unicode.IsControl(r) {
			return errors.New("name: no control characters")
		}
	}
	return nil
}

// SnapshotStarted is machine.snapshot's result: the job that makes it and the snapshot's id.
type SnapshotStarted struct {
	JobID      string `json:"jobId"`
	SnapshotID string `json:"snapshotId"`
}

// SnapshotsParams filter machine.snapshots (the caller's own snapshots).
type SnapshotsParams struct {
	MachineID string `json:"machineId,omitempty"`
}

// SnapshotQuota is a per-user limit: snapshots and bytes (0: no limit).
type SnapshotQuota struct {
	Count int   `json:"count"`
	Bytes int64 `json:"bytes"`
}

// SnapshotsResult is machine.snapshots' result.
type SnapshotsResult struct {
	Snapshots []model.Snapshot `json:"snapshots"`
	// Used is what the caller's snapshots take (all of them, whatever the filter); Quota the
	// caller's limit.
	Used  SnapshotQuota `json:"used"`
	Quota SnapshotQuota `json:"quota"`
}

// RestoreParams are the params of machine.restore.
type RestoreParams struct {
	SnapshotID string `json:"snapshotId"`
	// MachineID is the machine to restore into (default: the one the snapshot was taken of); it
	// must be of the same provider. Its disk is replaced; a running machine is stopped first and
	// started again after.
	MachineID string `json:"machineId,omitempty"`
}

// Validate implements kite.Validator.
func (p *RestoreParams) Validate() error { return required("snapshotId", p.SnapshotID) }

// SnapshotRef names a snapshot: the params of snapshot.delete.
type SnapshotRef struct {
	SnapshotID string `json:"snapshotId"`
}

// Validate implements kite.Validator.
func (p *SnapshotRef) Validate() error { return required("snapshotId", p.SnapshotID) }

// MachineSnapshot starts a snapshot of a machine's disk; it returns the job at once.
func (c *Client) MachineSnapshot(ctx context.Context, p SnapshotParams) (SnapshotStarted, error) {
	return RPCMachineSnapshot.Call(ctx, c.c, p)
}

// MachineSnapshots lists the caller's snapshots.
func (c *Client) MachineSnapshots(ctx context.Context, p SnapshotsParams) (SnapshotsResult, error) {
	return RPCMachineSnapshots.Call(ctx, c.c, p)
}

// MachineRestore starts restoring a snapshot into a machine; it returns the job at once.
func (c *Client) MachineRestore(ctx context.Context, p RestoreParams) (JobRef, error) {
	return RPCMachineRestore.Call(ctx, c.c, p)
}

// SnapshotDelete deletes a snapshot (its data and its record).
func (c *Client) SnapshotDelete(ctx context.Context, p SnapshotRef) (model.Snapshot, error) {
	return RPCSnapshotDelete.Call(ctx, c.c, p)
}
