package tfmachine

import (
	"context"
	"errors"
	"log/slog"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// ProviderSpec is a machine service's Terraform provider: its provider block has the endpoint
// and token kloud writes (see machinesvc.Template), and its resources get a *Conn from Configure.
type ProviderSpec[Req, M any] struct {
	// Name and Version are the provider's ("kloudlocal", "0.1.0").
	Name, Version string
	// Description is the provider schema's.
	Description string
	// Service is its machine service (Kind names it in messages: "local" machines).
	Service Service
	// Resources are the provider's resources.
	Resources []func() resource.Resource
	// Logger receives the provider's own log; nil discards.
	Logger *slog.Logger
}

// NewProvider returns the provider factory providerserver.Serve wants.
func NewProvider[Req, M any](spec ProviderSpec[Req, M]) func() provider.Provider {
	if spec.Logger == nil {
		spec.Logger = slog.New(slog.DiscardHandler)
	}
	return func() provider.Provider { return &machineProvider[Req, M]{spec: spec} }
}

type machineProvider[Req, M any] struct {
	spec ProviderSpec[Req, M]
}

// config is the provider block.
type config struct {
	Endpoint types.String `tfsdk:"endpoint"`
	Token    types.String `tfsdk:"token"`
}

// Conn is what resources get from Configure: the service client, or why there is none (a
// provider block without endpoint and token can validate and plan, nothing else).
type Conn[Req, M any] struct {
	c   *Client[Req, M]
	err error
	Log *slog.Logger
}

// API returns the service client or why there is none.
func (c *Conn[Req, M]) API() (*Client[Req, M], error) {
	if c.c == nil {
		return nil, c.err
	}
	return c.c, nil
}

func (p *machineProvider[Req, M]) Metadata(ctx context.Context, req provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = p.spec.Name
	resp.Version = p.spec.Version
}

func (p *machineProvider[Req, M]) Schema(ctx context.Context, req provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: p.spec.Description,
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
				Description: "The stack's token for kloud's " + p.spec.Service.Kind + " machine service (kloud sets it). Required for any operation on a machine.",
			},
		},
	}
}

func (p *machineProvider[Req, M]) Configure(ctx context.Context, req provider.ConfigureRequest, resp *provider.ConfigureResponse) {
	var cfg config
	resp.Diagnostics.Append(req.Config.Get(ctx, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	name := p.spec.Name
	for _, a := range []struct {
		name string
		v    types.String
	}{{"endpoint", cfg.Endpoint}, {"token", cfg.Token}} {
		if a.v.IsUnknown() {
			resp.Diagnostics.AddAttributeError(path.Root(a.name), name+": unknown "+a.name,
				"The provider's "+a.name+" must be known when Terraform plans; kloud sets it to a literal.")
		}
	}
	if resp.Diagnostics.HasError() {
		return
	}
	c := &Conn[Req, M]{Log: p.spec.Logger}
	switch {
	case cfg.Endpoint.ValueString() == "" || cfg.Token.ValueString() == "":
		c.err = errors.New("the " + name + " provider has no endpoint and token: only kloud can build " + p.spec.Service.Kind + " machines (it configures this provider for each stack build)")
	default:
		var err error
		if c.c, err = NewClient[Req, M](p.spec.Service, cfg.Endpoint.ValueString(), cfg.Token.ValueString()); err != nil {
			resp.Diagnostics.AddAttributeError(path.Root("endpoint"), name+": bad provider configuration", err.Error())
			return
		}
	}
	resp.ResourceData = c
}

func (p *machineProvider[Req, M]) Resources(ctx context.Context) []func() resource.Resource {
	return p.spec.Resources
}

func (p *machineProvider[Req, M]) DataSources(ctx context.Context) []func() datasource.DataSource {
	return nil
}

var _ provider.Provider = (*machineProvider[struct{}, struct{}])(nil)

// Options configure a machine service's provider (New of providers/local/tfprovider and
// providers/vagrant/tfprovider).
type Options struct {
	// Logger receives the provider's own log (the machines' lifecycle); nil discards. Terraform
	// shows a provider's standard error in its debug log (TF_LOG).
	Logger *slog.Logger
}
