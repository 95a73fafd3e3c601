package tfprovider

import (
	"context"
	"errors"
	"log/slog"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/providerserver"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"
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
type Options struct {
	// Logger receives the provider's own log (the machines' lifecycle); nil discards. Terraform
	// shows a provider's standard error in its debug log (TF_LOG).
	Logger *slog.Logger
}

// New returns the provider factory providerserver.Serve wants.
func New(opts Options) func() provider.Provider {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func() provider.Provider { return &kloudvagrant{log: log} }
}

// Serve serves the provider to Terraform until Terraform ends the process.
func Serve(ctx context.Context, opts Options) error {
	return providerserver.Serve(ctx, New(opts), providerserver.ServeOpts{Address: Address, ProtocolVersion: 6})
}

type kloudvagrant struct {
	log *slog.Logger
}

// config is the provider block.
type config struct {
	Endpoint types.String `tfsdk:"endpoint"`
	Token    types.String `tfsdk:"token"`
}

// client is what resources get from Configure: the service client, or why there is none (a
// provider block without endpoint and token can validate and plan, nothing else).
type client struct {
	c   *Client
	err error
	log *slog.Logger
}

// api returns the service client or why there is none.
func (c *client) api() (*Client, error) {
	if c.c == nil {
		return nil, c.err
	}
	return c.c, nil
}

func (p *kloudvagrant) Metadata(ctx context.Context, req provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = Name
	resp.Version = Version
}

func (p *kloudvagrant) Schema(ctx context.Context, req provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "Vagrant machines on the stack owner's own host (klient --vagrant), booted with cloud-init. " +
			"kloud asks that host to create them; this provider asks kloud's vagrant machine service, with a token kloud minted for the stack being built.",
		Attributes: map[string]schema.Attribute{
			// Both are written by kloud into a generated provider block. They are optional in
			// the schema only so that a template can be validated and planned (new machines
			// only) without them; every operation on a machine needs them.
			"endpoint": schema.StringAttribute{
				Optional:    true,
				Description: "kloud's URL as reachable from this host (kloud sets it). Required for any operation on a machine.",
			},
			"token": schema.StringAttribute{
				Optional:    true,
				Sensitive:   true,
				Description: "The stack's token for kloud's vagrant machine service (kloud sets it). Required for any operation on a machine.",
			},
		},
	}
}

func (p *kloudvagrant) Configure(ctx context.Context, req provider.ConfigureRequest, resp *provider.ConfigureResponse) {
	var cfg config
	resp.Diagnostics.Append(req.Config.Get(ctx, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	for _, a := range []struct {
		name string
		v    types.String
	}{{"endpoint", cfg.Endpoint}, {"token", cfg.Token}} {
		if a.v.IsUnknown() {
			resp.Diagnostics.AddAttributeError(path.Root(a.name), "kloudvagrant: unknown "+a.name,
				"The provider's "+a.name+" must be known when Terraform plans; kloud sets it to a literal.")
		}
	}
	if resp.Diagnostics.HasError() {
		return
	}
	c := &client{log: p.log}
	switch {
	case cfg.Endpoint.ValueString() == "" || cfg.Token.ValueString() == "":
		c.err = errors.New("the kloudvagrant provider has no endpoint and token: only kloud can build vagrant machines (it configures this provider for each stack build)")
	default:
		var err error
		if c.c, err = NewClient(cfg.Endpoint.ValueString(), cfg.Token.ValueString()); err != nil {
			resp.Diagnostics.AddAttributeError(path.Root("endpoint"), "kloudvagrant: bad provider configuration", err.Error())
			return
		}
	}
	resp.ResourceData = c
}

func (p *kloudvagrant) Resources(ctx context.Context) []func() resource.Resource {
	return []func() resource.Resource{func() resource.Resource { return &machineResource{} }}
}

func (p *kloudvagrant) DataSources(ctx context.Context) []func() datasource.DataSource {
	return nil
}

var _ provider.Provider = (*kloudvagrant)(nil)
