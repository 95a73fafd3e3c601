package tfprovider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/providerserver"
	"github.com/hashicorp/terraform-plugin-framework/resource"

	"github.com/kloud-dev/kloud/provider/machinesvc/tfmachine"
)

// Identity of the provider: the mirror path is registry.terraform.io/kloud/kloudvagrant/<Version>.
const (
	Address      = "registry.terraform.io/kloud/kloudvagrant"
	Source       = "kloud/kloudvagrant" // for required_providers
	Name         = "kloudvagrant"
	Version      = "0.1.0"
	ResourceType = Name + "_machine"
)

// Options configure the provider.
type Options = tfmachine.Options

// New returns the provider factory providerserver.Serve wants (tfmachine.NewProvider).
func New(opts Options) func() provider.Provider {
	return tfmachine.NewProvider(tfmachine.ProviderSpec[CreateRequest, Machine]{
		Name: Name, Version: Version, Service: service, Logger: opts.Logger,
		Description: "Vagrant machines on the stack owner's own host (klient --vagrant), booted with cloud-init. " +
			"kloud asks that host to create them; this provider asks kloud's vagrant machine service, with a token kloud minted for the stack being built.",
		Resources: []func() resource.Resource{newMachineResource},
	})
}

// Serve serves the provider to Terraform until Terraform ends the process.
func Serve(ctx context.Context, opts Options) error {
	return providerserver.Serve(ctx, New(opts), providerserver.ServeOpts{Address: Address, ProtocolVersion: 6})
}
