package tfprovider

import (
	"context"
	"fmt"
	"regexp"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/kloud-dev/kloud/provider/machinesvc/tfmachine"
	"github.com/kloud-dev/kloud/providers/internal/machinemodel"
)

// newMachineResource returns kloudvagrant_machine: the machine service's resource
// (tfmachine.Resource) with this model and schema.
func newMachineResource() resource.Resource {
	return &tfmachine.Resource[machineModel, *machineModel, CreateRequest, Machine]{
		Name: Name, MachineSchema: machineSchema(), NotFound: ErrNotFound,
	}
}

// machineModel is the resource's data, in Terraform and in state.
type machineModel struct {
	machinemodel.Base              // id, hostname, user_data, tags, state
	Memory            types.Int64  `tfsdk:"memory"`
	CPUs              types.Int64  `tfsdk:"cpus"`
	Image             types.String `tfsdk:"image"`
	Box               types.String `tfsdk:"box"`
	Provider          types.String `tfsdk:"vagrant_provider"`
	Host              types.String `tfsdk:"host"`
}

func machineSchema() schema.Schema {
	return schema.Schema{
		Description: "A Vagrant machine on the stack owner's vagrant host (klient --vagrant), booted with cloud-init on a NoCloud seed. It keeps running after Terraform exits.",
		Attributes: machinemodel.Attributes(
			"The Vagrant machine's name on its host (its directory under the host klient's vagrant home).",
			"Host name inside the machine (one RFC 1123 label, at most 63 characters).",
			`"running", "stopped", ...`,
			map[string]schema.Attribute{
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
				"host": schema.StringAttribute{
					Computed:      true,
					Description:   "The kite id of the vagrant host (klient --vagrant) the machine lives on.",
					PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
				},
			}),
	}
}

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// Validate reports bad values at plan time, before any machine is made.
func (m *machineModel) Validate(diags *diag.Diagnostics) {
	tfmachine.ValidHostname(Name, m.Hostname, hostnameRE.MatchString, "one label of letters, digits and '-'", diags)
	if v := m.Memory; !v.IsNull() && !v.IsUnknown() && v.ValueInt64() < 64 {
		diags.AddAttributeError(path.Root("memory"), "kloudvagrant: memory too small",
			fmt.Sprintf("memory = %d MiB: at least 64; leave it unset for the provider's default", v.ValueInt64()))
	}
	if v := m.CPUs; !v.IsNull() && !v.IsUnknown() && v.ValueInt64() < 1 {
		diags.AddAttributeError(path.Root("cpus"), "kloudvagrant: cpus too small",
			fmt.Sprintf("cpus = %d: at least 1; leave it unset for the provider's default", v.ValueInt64()))
	}
	if !m.Image.IsUnknown() && !m.Box.IsUnknown() && m.Image.IsNull() == m.Box.IsNull() {
		diags.AddAttributeError(path.Root("image"), "kloudvagrant: image or box",
			"Set exactly one of image (a Docker image, Vagrant's docker provider) and box (a Vagrant box).")
	}
}

func (m *machineModel) Request(tags map[string]string) CreateRequest {
	return CreateRequest{
		Hostname: m.Hostname.ValueString(),
		UserData: m.UserData.ValueString(),
		MemoryMB: m.Memory.ValueInt64(),
		CPUs:     m.CPUs.ValueInt64(),
		Image:    m.Image.ValueString(),
		Box:      m.Box.ValueString(),
		Provider: m.Provider.ValueString(),
		Tags:     tags,
	}
}

func (m *machineModel) Created(in Machine) {
	m.ID = types.StringValue(in.ID)
	m.Host = types.StringValue(in.Host)
	m.State = types.StringValue(in.State)
}

func (m *machineModel) Retagged(in Machine) {
	m.State = types.StringValue(in.State)
	m.Host = types.StringValue(in.Host)
}

// Fill copies what the service reports into the model. Unset limits stay null, so a machine
// without limits shows no drift.
func (st *machineModel) Fill(ctx context.Context, m Machine) diag.Diagnostics {
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
	diags.Append(tfmachine.FillTags(ctx, &st.Tags, m.Tags)...)
	st.Host = types.StringValue(m.Host)
	st.State = types.StringValue(m.State)
	return diags
}

var (
	_ resource.ResourceWithConfigure      = (*tfmachine.Resource[machineModel, *machineModel, CreateRequest, Machine])(nil)
	_ resource.ResourceWithValidateConfig = (*tfmachine.Resource[machineModel, *machineModel, CreateRequest, Machine])(nil)
	_ resource.ResourceWithImportState    = (*tfmachine.Resource[machineModel, *machineModel, CreateRequest, Machine])(nil)
)
