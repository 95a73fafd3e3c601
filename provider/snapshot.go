package provider

import (
	"context"
	"errors"
	"fmt"
	"regexp"
)

// Snapshotter is implemented by machines whose disk can be saved and restored (capability
// CapSnapshot; machine.snapshot, machine.restore and snapshot.delete in kloud). kloud chooses the
// snapshot ids (SnapshotIDOK) and keeps the list of snapshots, their owners, names and sizes in
// its store; the provider keeps the data, under the id, wherever it likes (the local provider:
// a compressed archive of the machine's disk in its state directory).
//
// Snapshot and Restore need a stopped machine: kloud stops a running machine first and starts it
// again after. A provider that finds the machine running returns an error wrapping ErrRunning.
//
// A snapshot belongs to the provider, not to the machine it was taken of: Restore may be called
// on any machine of the same provider (restoring into a new machine), and DeleteSnapshot on the
// machine it was taken of even after that machine was destroyed (kloud builds the Machine from
// the attributes it recorded with the snapshot). Restore keeps the target machine's own identity
// (its agent key, its cloud-init seed): the restored disk is the snapshot's, the machine is still
// the one restored into.
type Snapshotter interface {
	// Snapshot saves the machine's disk as snapID. On error nothing of snapID is left.
	Snapshot(ctx context.Context, snapID string) (SnapshotInfo, error)
	// Restore replaces the machine's disk by snapshot snapID's, atomically: on error the disk is
	// what it was.
	Restore(ctx context.Context, snapID string) error
	// DeleteSnapshot removes snapshot snapID; a snapshot that does not exist is not an error.
	DeleteSnapshot(ctx context.Context, snapID string) error
}

// SnapshotInfo describes a saved snapshot.
type SnapshotInfo struct {
	// Size is what the snapshot takes where the provider keeps it, in bytes (counted against
	// the owner's quota).
	Size int64 `json:"size"`
	// DiskSize is the size of the data saved (before compression), in bytes; 0 if unknown.
	DiskSize int64 `json:"diskSize,omitempty"`
	// Format says how it is kept, e.g. "tar+zstd".
	Format string `json:"format,omitempty"`
}

// ErrRunning is returned (wrapped) by Snapshot or Restore of a machine that is running: stop it
// first. Kloud maps it to -32005.
var ErrRunning = errors.New("the machine is running; stop it first")

var snapIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// SnapshotIDOK checks a snapshot id as providers receive it: 1-64 of [A-Za-z0-9_-], not starting
// with _ or - (safe as a file name, a label or a tag everywhere).
func SnapshotIDOK(id string) error {
	if !snapIDRE.MatchString(id) {
		return fmt.Errorf("snapshot id %q: want 1-64 characters of [A-Za-z0-9_-], starting with a letter or digit", id)
	}
	return nil
}
