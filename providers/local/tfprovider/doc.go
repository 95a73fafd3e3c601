// Package tfprovider is the Terraform provider "kloudlocal" (registry.terraform.io/kloud/kloudlocal,
// built on terraform-plugin-framework): its one resource, kloudlocal_machine, is a local namespace
// machine from package sandbox. cmd/terraform-provider-kloudlocal serves it; scripts/build-kloudlocal.sh
// builds that binary into the offline provider mirror.
//
// Start reading at New (provider.go), then machineModel (machine.go) and Client (api.go): the
// provider, the resource's operations and the client are package provider/machinesvc/tfmachine's,
// shared with the kloudvagrant provider; this package has the identity, schema and types.
//
// # Configuration
//
//	provider "kloudlocal" {
//	  endpoint = "http://127.0.0.1:7000" # kloud, as reachable from this host
//	  token    = var.kloud_local_token   # sensitive: the stack's token for kloud's service
//	}
//
// The provider needs no privilege and touches nothing on the host: every operation is a request
// to kloud's local machine service (APIPath on kloud's HTTP server), which creates, retags and
// destroys machines in kloud's process, only for the stack the token was minted for. Kloud
// (package providers/local) writes this block itself for each stack build; a template's own
// provider "kloudlocal" block must be empty. Without endpoint and token the provider still
// validates and plans new machines (kloud's stack plan), but refuses every operation on one. The
// state dir, base image, bridge and subnet are kloud's configuration.
//
// # kloudlocal_machine
//
//	resource "kloudlocal_machine" "web" {
//	  count     = 2
//	  hostname  = "web-${count.index}"  # required; replaces the machine when changed
//	  user_data = "#cloud-config\n..."   # sensitive; replaces the machine when changed
//	  memory    = 512                    # MiB (cgroup limit), optional; replaces
//	  cpus      = 0.5                    # optional; replaces
//	  tags      = { team = "a" }         # optional; updated in place
//	}
//	# computed: id (the sandbox machine id), ip_address, state ("running" or "stopped")
//
// Create returns once the machine's PID 1 runs (cloud-init continues in the machine); the machine
// is kloud's child, not terraform's, and outlives Terraform. Read removes a machine that no longer
// exists from the state and accepts a stopped one (kloud stops machines outside Terraform).
// Delete destroys the machine and everything it owns. kloud's tags kloud_stack and
// kloud_machine must be among the tags (kloud adds them): the service creates only the machines
// of the token's stack build.
package tfprovider
