// Package tfprovider is the Terraform provider "kloudlocal" (registry.terraform.io/kloud/kloudlocal,
// built on terraform-plugin-framework): its one resource, kloudlocal_machine, is a local namespace
// machine from package sandbox. cmd/terraform-provider-kloudlocal serves it; scripts/build-kloudlocal.sh
// builds that binary into the offline provider mirror.
//
// Start reading at New (provider.go), then machineResource (machine.go).
//
// # Configuration
//
//	provider "kloudlocal" {
//	  state_dir  = "/var/lib/kloud/machines" # sandbox.DefaultStateDir
//	  base_image = "..."                     # default: sandbox.EnsureBaseImage under $KLOUD_CACHE
//	  bridge     = "kd-br0"                  # sandbox.DefaultBridge
//	  subnet     = "10.200.0.0/24"           # sandbox.DefaultSubnet
//	}
//
// Every attribute is optional, so a template may have an empty provider block or none. Kloud
// (package providers/local) writes the block itself so that Terraform and kloud's own machine
// operations (start, stop, info) work on the same state dir and bridge.
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
// outlives Terraform and this provider's process. Read removes a machine that no longer exists
// from the state and accepts a stopped one (kloud stops machines outside Terraform). Delete
// destroys the machine and everything it owns.
//
// The provider's process is also each machine's launcher and PID 1 (sandbox re-executes the
// calling binary), which is why the binary's main calls sandbox.MaybeRunInit first.
package tfprovider
