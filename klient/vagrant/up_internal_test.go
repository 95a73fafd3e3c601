package vagrant

import (
	"errors"
	"testing"
)

// TestVanishedContainer: the failure of a `vagrant up` whose docker provider inspected a
// container that was removed after it listed it (as seen in e2e, a machine of a two-machine
// stack) is retried; other failures are not.
func TestVanishedContainer(t *testing.T) {
	seen := `vagrant up (machine k-1-64cbf237): exit status 1: Bringing machine 'default' up with 'docker' provider...
==> default: Creating and configuring docker networks...
A Docker command executed by Vagrant didn't complete successfully!
Command: ["docker", "inspect", "201674c8c32819bb93dd00b4d3ff068cf41d2705b136cf9a54087f2bba1d9a42", {:notify=>[:stdout, :stderr]}]

Stderr: Error: No such object: 201674c8c32819bb93dd00b4d3ff068cf41d2705b136cf9a54087f2bba1d9a42`
	if !vanishedContainer(errors.New(seen)) {
		t.Errorf("not recognised as a vanished container:\n%s", seen)
	}
	for _, other := range []string{
		`vagrant up (machine m): exit status 1: Stderr: Error: No such image: kloud-vagrant-e2e:1`,
		`vagrant up (machine m): exit status 1: Command: ["docker", "run", "--name", "m"] Stderr: Error: No such object: x`,
		`vagrant up (machine m): context deadline exceeded`,
	} {
		if vanishedContainer(errors.New(other)) {
			t.Errorf("retried, but it is not a vanished container: %s", other)
		}
	}
}
