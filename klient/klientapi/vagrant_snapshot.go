package klientapi

import (
	"fmt"
	"regexp"
)

// Snapshots of vagrant machines (vagrant.snapshot.save/restore/delete): the host klient keeps
// them. With Vagrant's docker provider a snapshot is the container's writable layer (its overlay2
// upper dir) as a compressed archive in the klient's vagrant home; with a box provider that has
// snapshots (virtualbox, libvirt, ...) it is `vagrant snapshot save` of the machine, kept by the
// hypervisor. Save and restore need the machine stopped (halted).

// VagrantSnapshotFormatLayer and VagrantSnapshotFormatVagrant are VagrantSnapshot.Format's values.
const (
	VagrantSnapshotFormatLayer   = "overlay2-layer+tar+zstd" // a docker machine's writable layer
	VagrantSnapshotFormatVagrant = "vagrant-snapshot"        // `vagrant snapshot save` (box providers)
)

var vagrantSnapshotRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// ValidVagrantSnapshot checks a snapshot id: 1-64 of [A-Za-z0-9_-], starting with a letter or
// digit (kloud's snapshot ids; safe as a file name and a Vagrant snapshot name).
func ValidVagrantSnapshot(id string) error {
	if !vagrantSnapshotRE.MatchString(id) {
		return fmt.Errorf("snapshot %q: want 1-64 of [A-Za-z0-9_-], starting with a letter or digit", id)
	}
	return nil
}

// VagrantSnapshotParams are the params of vagrant.snapshot.save, .restore and .delete: machine
// Name, snapshot id Snapshot. Restore may name another machine of the host than the one the
// snapshot was taken of (docker machines of the same image); delete names the machine the
// snapshot was taken of, which may be gone.
type VagrantSnapshotParams struct {
	Token    string `json:"token"`
	Name     string `json:"name"`
	Snapshot string `json:"snapshot"`
}

// Validate implements kite.Validator.
func (p *VagrantSnapshotParams) Validate() error {
	if err := validToken(p.Token); err != nil {
		return err
	}
	if err := ValidVagrantName(p.Name); err != nil {
		return err
	}
	return ValidVagrantSnapshot(p.Snapshot)
}

// VagrantSnapshot is the result of vagrant.snapshot.save.
type VagrantSnapshot struct {
	ID      string `json:"id"`
	Machine string `json:"machine"`
	// Size is what the snapshot takes on the host in bytes (0: unknown, a hypervisor's).
	Size int64 `json:"size"`
	// DiskSize is the data saved, uncompressed (0: unknown).
	DiskSize int64  `json:"diskSize,omitempty"`
	Format   string `json:"format"`
}
