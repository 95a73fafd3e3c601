package tfprovider

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// machineResource is kloudvagrant_machine.
type machineResource struct {
	c *client
}

// machineModel is the resource's data, in Terraform and in state.
type machineModel struct {
	ID       types.String `tfsdk:"id"`
	Hostname types.String `tfsdk:"hostname"`
	UserData types.String `tfsdk:"user_data"`
	Memory   types.Int64  `tfsdk:"memory"`
	CPUs     types.Int64  `tfsdk:"cpus"`
	Image    types.String `tfsdk:"image"`
	Box      types.String `tfsdk:"box"`
	Provider types.String `tfsdk:"vagrant_provider"`
	Tags     types.Map    `tfsdk:"tags"`
	Host     types.String `tfsdk:"host"`
	State    types.String `tfsdk:"state"`
}

func (r *machineResource) Metadata(ctx context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_machine"
}

func (r *machineResource) Schema(ctx context.Context, req resource.SchemaRequest, resp *resource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "A Vagrant machine on the stack owner's vagrant host (klient --vagrant), booted with cloud-init on a NoCloud seed. It keeps running after Terraform exits.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				Computed:      true,
				Description:   "The Vagrant machine's name on its host (its directory under the host klient's vagrant home).",
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
			"hostname": schema.StringAttribute{
				Required:      true,
				Description:   "Host name inside the machine (one RFC 1123 label, at most 63 characters).",
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
			},
			"user_data": schema.StringAttribute{
				Optional:      true,
				Sensitive:     true,
				Description:   "cloud-init user data (NoCloud seed). Changing it replaces the machine.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
			},
			"memory": schema.Int64Attribute{
				Optional:      true,
				Description:   "Memory in MiB, at least 64. Unset: the Vagrant provider's default.",
				PlanModifiers: []planmodifier.Int64{int64planmodifier.RequiresReplace()},
			},
			"cpus": schema.Int64Attribute{
				Optional:      true,
				Description:   "CPUs, at least 1. Unset: the Vagrant provider's default.",
				PlanModifiers: []planmodifier.Int64{int64planmodifier.RequiresReplace()},
			},
			"image": schema.StringAttribute{
				Optional:      true,
				Description:   "A Docker image with cloud-init (Vagrant's docker provider). Exactly one of image and box.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
			},
			"box": schema.StringAttribute{
				Optional:      true,
				Description:   "A Vagrant box with cloud-init (virtualbox, libvirt, ... providers). Exactly one of image and box.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
			},
			"vagrant_provider": schema.StringAttribute{
				Optional:      true,
				Description:   "The Vagrant provider (default: docker for an image, Vagrant's default for a box).",
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
			},
			"tags": schema.MapAttribute{
				Optional:    true,
				ElementType: types.StringType,
				Description: "Tags kept with the machine (kloud sets its stack and machine ids). Updated in place.",
			},
			"host": schema.StringAttribute{
				Computed:      true,
				Description:   "The kite id of the vagrant host (klient --vagrant) the machine lives on.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
			"state": schema.StringAttribute{
				Computed:      true,
				Description:   `"running", "stopped", ... (kloud stops and starts machines outside Terraform).`,
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
		},
	}
}

func (r *machineResource) Configure(ctx context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	if req.ProviderData == nil {
		return // not configured yet (validation)
	}
	c, ok := req.ProviderData.(*client)
	if !ok {
		resp.Diagnostics.AddError("kloudvagrant: internal error", fmt.Sprintf("provider data of type %T", req.ProviderData))
		return
	}
	r.c = c
}

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// ValidateConfig reports bad values at plan time, before any machine is made.
func (r *machineResource) ValidateConfig(ctx context.Context, req resource.ValidateConfigRequest, resp *resource.ValidateConfigResponse) {
	var m machineModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if h := m.Hostname; !h.IsNull() && !h.IsUnknown() {
		if s := h.ValueString(); len(s) > 63 || !hostnameRE.MatchString(s) {
			resp.Diagnostics.AddAttributeError(path.Root("hostname"), "kloudvagrant: bad hostname",
				fmt.Sprintf("%q is not a valid host name: one label of letters, digits and '-', at most 63 characters", s))
		}
	}
	if v := m.Memory; !v.IsNull() && !v.IsUnknown() && v.ValueInt64() < 64 {
		resp.Diagnostics.AddAttributeError(path.Root("memory"), "kloudvagrant: memory too small",
			fmt.Sprintf("memory = %d MiB: at least 64; leave it unset for the provider's default", v.ValueInt64()))
	}
	if v := m.CPUs; !v.IsNull() && !v.IsUnknown() && v.ValueInt64() < 1 {
		resp.Diagnostics.AddAttributeError(path.Root("cpus"), "kloudvagrant: cpus too small",
			fmt.Sprintf("cpus = %d: at least 1; leave it unset for the provider's default", v.ValueInt64()))
	}
	if !m.Image.IsUnknown() && !m.Box.IsUnknown() && m.Image.IsNull() == m.Box.IsNull() {
		resp.Diagnostics.AddAttributeError(path.Root("image"), "kloudvagrant: image or box",
			"Set exactly one of image (a Docker image, Vagrant's docker provider) and box (a Vagrant box).")
	}
}

func (r *machineResource) api() (*Client, error) {
	if r.c == nil {
		return nil, errors.New("the kloudvagrant provider is not configured")
	}
	return r.c.api()
}

// fill copies what the service reports into the model. Unset limits stay null, so a machine
// without limits shows no drift.
func fill(ctx context.Context, st *machineModel, m Machine) diag.Diagnostics {
	var diags diag.Diagnostics
	st.ID = types.StringValue(m.ID)
	if m.Hostname != "" {
		st.Hostname = types.StringValue(m.Hostname)
	}
	if m.MemoryMB != 0 || !st.Memory.IsNull() {
		st.Memory = types.Int64Value(m.MemoryMB)
	}
	if m.CPUs != 0 || !st.CPUs.IsNull() {
		st.CPUs = types.Int64Value(m.CPUs)
	}
	if m.Image != "" {
		st.Image = types.StringValue(m.Image)
	}
	if m.Box != "" {
		st.Box = types.StringValue(m.Box)
	}
	if len(m.Tags) > 0 || !st.Tags.IsNull() {
		tags := m.Tags
		if tags == nil {
			tags = map[string]string{}
		}
		tv, d := types.MapValueFrom(ctx, types.StringType, tags)
		diags.Append(d...)
		st.Tags = tv
	}
	st.Host = types.StringValue(m.Host)
	st.State = types.StringValue(m.State)
	return diags
}

func (r *machineResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan machineModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	api, err := r.api()
	if err != nil {
		resp.Diagnostics.AddError("kloudvagrant: cannot create machines", err.Error())
		return
	}
	tags, diags := tagsOf(ctx, plan.Tags)
	resp.Diagnostics.Append(diags...)
	if resp.Diagnostics.HasError() {
		return
	}
	spec := CreateRequest{
		Hostname: plan.Hostname.ValueString(),
		UserData: plan.UserData.ValueString(),
		MemoryMB: plan.Memory.ValueInt64(),
		CPUs:     plan.CPUs.ValueInt64(),
		Image:    plan.Image.ValueString(),
		Box:      plan.Box.ValueString(),
		Provider: plan.Provider.ValueString(),
		Tags:     tags,
	}
	m, err := api.Create(ctx, spec)
	if err != nil {
		resp.Diagnostics.AddError("kloudvagrant: create machine "+spec.Hostname, err.Error())
		return
	}
	// The plan's values stay (user_data is not reported back); the service's fill in the rest.
	plan.ID = types.StringValue(m.ID)
	plan.Host = types.StringValue(m.Host)
	plan.State = types.StringValue(m.State)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *machineResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var st machineModel
	resp.Diagnostics.Append(req.State.Get(ctx, &st)...)
	if resp.Diagnostics.HasError() {
		return
	}
	api, err := r.api()
	if err != nil {
		resp.Diagnostics.AddError("kloudvagrant: cannot read machine "+st.ID.ValueString(), err.Error())
		return
	}
	m, err := api.Read(ctx, st.ID.ValueString())
	if errors.Is(err, ErrNotFound) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		resp.Diagnostics.AddError("kloudvagrant: read machine "+st.ID.ValueString(), err.Error())
		return
	}
	// What the machine really has, so drift shows in the plan.
	resp.Diagnostics.Append(fill(ctx, &st, m)...)
	resp.Diagnostics.Append(resp.State.Set(ctx, &st)...)
}

// Update changes tags only: every other argument replaces the machine.
func (r *machineResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan machineModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	api, err := r.api()
	if err != nil {
		resp.Diagnostics.AddError("kloudvagrant: cannot update machine "+plan.ID.ValueString(), err.Error())
		return
	}
	tags, diags := tagsOf(ctx, plan.Tags)
	resp.Diagnostics.Append(diags...)
	if resp.Diagnostics.HasError() {
		return
	}
	m, err := api.SetTags(ctx, plan.ID.ValueString(), tags)
	if err != nil {
		resp.Diagnostics.AddError("kloudvagrant: update machine "+plan.ID.ValueString(), err.Error())
		return
	}
	plan.State = types.StringValue(m.State)
	plan.Host = types.StringValue(m.Host)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *machineResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var st machineModel
	resp.Diagnostics.Append(req.State.Get(ctx, &st)...)
	if resp.Diagnostics.HasError() {
		return
	}
	api, err := r.api()
	if err != nil {
		resp.Diagnostics.AddError("kloudvagrant: cannot destroy machine "+st.ID.ValueString(), err.Error())
		return
	}
	if err := api.Delete(ctx, st.ID.ValueString()); err != nil {
		resp.Diagnostics.AddError("kloudvagrant: destroy machine "+st.ID.ValueString(), err.Error())
	}
}

// ImportState takes a machine id; Read fills in the rest (user_data stays unknown to Terraform).
func (r *machineResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("id"), req.ID)...)
}

func tagsOf(ctx context.Context, m types.Map) (map[string]string, diag.Diagnostics) {
	if m.IsNull() || m.IsUnknown() {
		return nil, nil
	}
	out := map[string]string{}
	diags := m.ElementsAs(ctx, &out, false)
	return maps.Clone(out), diags
}

var (
	_ resource.Resource                   = (*machineResource)(nil)
	_ resource.ResourceWithConfigure      = (*machineResource)(nil)
	_ resource.ResourceWithValidateConfig = (*machineResource)(nil)
	_ resource.ResourceWithImportState    = (*machineResource)(nil)
)
