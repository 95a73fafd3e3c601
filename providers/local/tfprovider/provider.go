package tfprovider

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/providerserver"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

// Identity of the provider: the mirror path is registry.terraform.io/kloud/kloudlocal/<Version>.
const (
	Address      = "registry.terraform.io/kloud/kloudlocal"
	Source       = "kloud/kloudlocal" // for required_providers
	Name         = "kloudlocal"
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
	return func() provider.Provider { return &kloudlocal{log: log} }
}

// Serve serves the provider to Terraform until Terraform ends the process.
func Serve(ctx context.Context, opts Options) error {
	return providerserver.Serve(ctx, New(opts), providerserver.ServeOpts{Address: Address, ProtocolVersion: 6})
}

type kloudlocal struct {
	log *slog.Logger
}

// config is the provider block.
type config struct {
	StateDir  types.String `tfsdk:"state_dir"`
	BaseImage types.String `tfsdk:"base_image"`
	Bridge    types.String `tfsdk:"bridge"`
	Subnet    types.String `tfsdk:"subnet"`
}

// client is what resources get from Configure: the machine library on the configured state dir,
// and the base image, found (or built) on first use.
type client struct {
	m    *sandbox.Manager // without a base image: everything but Create
	opts sandbox.Options
	log  *slog.Logger

	mu        sync.Mutex
	baseImage string // configured, else resolved by image()
}

// creator returns a Manager that creates machines on base.
func (c *client) creator(base string) (*sandbox.Manager, error) {
	o := c.opts
	o.BaseImage = base
	return sandbox.New(o)
}

// image returns the base image path: the configured one, else EnsureBaseImage's (a cached image
// is found without running anything).
func (c *client) image(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.baseImage != "" {
		return c.baseImage, nil
	}
	p, err := sandbox.EnsureBaseImage(ctx, "", c.log)
	if err != nil {
		return "", err
	}
	c.baseImage = p
	return p, nil
}

func (p *kloudlocal) Metadata(ctx context.Context, req provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = Name
	resp.Version = Version
}

func (p *kloudlocal) Schema(ctx context.Context, req provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "Local machines made of Linux namespaces over a Debian root filesystem, booted with real cloud-init. Needs root.",
		Attributes: map[string]schema.Attribute{
			"state_dir": schema.StringAttribute{
				Optional:    true,
				Description: "Directory holding the machines' records and disks. Default " + sandbox.DefaultStateDir + ". Kloud must use the same one.",
			},
			"base_image": schema.StringAttribute{
				Optional:    true,
				Description: "Root filesystem new machines are created on. Default: the base image cached under $KLOUD_CACHE (built with mmdebstrap when missing).",
			},
			"bridge": schema.StringAttribute{
				Optional:    true,
				Description: "Host bridge the machines are attached to. Default " + sandbox.DefaultBridge + ".",
			},
			"subnet": schema.StringAttribute{
				Optional:    true,
				Description: "IPv4 subnet of the bridge (/16 to /30); the host is its first address. Default " + sandbox.DefaultSubnet + ".",
			},
		},
	}
}

func (p *kloudlocal) Configure(ctx context.Context, req provider.ConfigureRequest, resp *provider.ConfigureResponse) {
	var cfg config
	resp.Diagnostics.Append(req.Config.Get(ctx, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	for _, a := range []struct {
		name string
		v    types.String
	}{{"state_dir", cfg.StateDir}, {"base_image", cfg.BaseImage}, {"bridge", cfg.Bridge}, {"subnet", cfg.Subnet}} {
		if a.v.IsUnknown() {
			resp.Diagnostics.AddAttributeError(path.Root(a.name), "kloudlocal: unknown "+a.name,
				"The provider's "+a.name+" must be known when Terraform plans; use a literal or a variable, not another resource's attribute.")
		}
	}
	if resp.Diagnostics.HasError() {
		return
	}
	if err := sandbox.Available(); err != nil {
		resp.Diagnostics.AddError("kloudlocal: local machines cannot run here", err.Error())
		return
	}
	opts := sandbox.Options{
		StateDir: cfg.StateDir.ValueString(), BaseImage: cfg.BaseImage.ValueString(),
		Bridge: cfg.Bridge.ValueString(), Logger: p.log,
	}
	if s := cfg.Subnet.ValueString(); s != "" {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			resp.Diagnostics.AddAttributeError(path.Root("subnet"), "kloudlocal: bad subnet", fmt.Sprintf("subnet %q: %s", s, err))
			return
		}
		opts.Subnet = pfx
	}
	m, err := sandbox.New(opts)
	if err != nil {
		resp.Diagnostics.AddError("kloudlocal: bad provider configuration", err.Error())
		return
	}
	c := &client{m: m, opts: opts, log: p.log, baseImage: opts.BaseImage}
	resp.ResourceData = c
}

func (p *kloudlocal) Resources(ctx context.Context) []func() resource.Resource {
	return []func() resource.Resource{func() resource.Resource { return &machineResource{} }}
}

func (p *kloudlocal) DataSources(ctx context.Context) []func() datasource.DataSource {
	return nil
}

var _ provider.Provider = (*kloudlocal)(nil)
