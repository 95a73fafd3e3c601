// Package tfprovider is the Terraform provider "kloudvagrant" (registry.terraform.io/kloud/kloudvagrant,
// built on terraform-plugin-framework): its one resource, kloudvagrant_machine, is a Vagrant
// machine on the stack owner's own host, where a klient --vagrant runs. cmd/terraform-provider-kloudvagrant
// serves it; scripts/build-kloudvagrant.sh builds that binary into the offline provider mirror.
//
// Start reading at New (provider.go), then machineModel (machine.go) and Client (api.go): the
// provider, the resource's operations and the client are package provider/machinesvc/tfmachine's,
// shared with the kloudlocal provider; this package has the identity, schema and types.
//
// # Configuration
//
//	provider "kloudvagrant" {
//	  endpoint = "http://127.0.0.1:7000"  # kloud, as reachable from this host
//	  token    = var.kloud_vagrant_token  # sensitive: the stack's token for kloud's service
//	}
//
// The provider needs no privilege and reaches no host itself: every operation is a request to
// kloud's vagrant machine service (APIPath on kloud's HTTP server), which calls the vagrant.*
// methods of the owner's host klient over kite (the way Koding's vagrant provider asked the
// klient on the user's host), only for the stack the token was minted for. Kloud (package
// providers/vagrant) writes this block itself for each stack build; a template's own provider
// "kloudvagrant" block must be empty.
//
// # kloudvagrant_machine
//
//	resource "kloudvagrant_machine" "web" {
//	  count     = 2
//	  hostname  = "web-${count.index}"   # required; replaces the machine when changed
//	  image     = "kloud/debian:bookworm" # a Docker image (Vagrant's docker provider), or
//	  # box     = "debian/bookworm64"     # a Vagrant box (virtualbox, libvirt, ...)
//	  # vagrant_provider = "virtualbox"   # optional: the Vagrant provider
//	  memory    = 512                     # MiB, optional; replaces
//	  cpus      = 1                       # optional; replaces
//	  user_data = "#cloud-config\n..."    # sensitive; kloud sets it (the agent); replaces
//	  tags      = { team = "a" }          # optional; updated in place
//	}
//	# computed: id (the Vagrant machine's name on the host), host (the host klient's kite id),
//	# state ("running", "stopped", ...)
//
// Create returns once `vagrant up` has finished (cloud-init continues in the machine). Read
// removes a machine that no longer exists from the state and accepts a stopped one. Delete runs
// `vagrant destroy -f` and removes the machine's directory.
package tfprovider
