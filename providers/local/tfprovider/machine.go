package tfprovider

import (
	"context"
	"fmt"
	"regexp"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/float64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/kloud-dev/kloud/provider/machinesvc/tfmachine"
	"github.com/kloud-dev/kloud/providers/internal/machinemodel"
)

// newMachineResource returns kloudlocal_machine: the machine service's resource
// (tfmachine.Resource) with this model and schema.
func newMachineResource() resource.Resource {
	return &tfmachine.Resource[machineModel, *machineModel, CreateRequest, Machine]{
		Name: Name, MachineSchema: machineSchema(), NotFound: ErrNotFound,
	}
}

// machineModel is the resource's data, in Terraform and in state.
type machineModel struct {
	machinemodel.Base               // id, hostname, user_data, tags, state
	Memory            types.Int64   `tfsdk:"memory"`
	CPUs              types.Float64 `tfsdk:"cpus"`
	DiskMB            types.Int64   `tfsdk:"disk_mb"`
	IPAddress         types.String  `tfsdk:"ip_address"`
}

func machineSchema() schema.Schema {
	return schema.Schema{
		Description: "A local namespace machine booted with cloud-init. It keeps running after Terraform exits.",
		Attributes: machinemodel.Attributes(
			"The machine's id on this host (its directory under the state dir).",
			"Host name inside the machine (RFC 1123, at most 63 characters).",
			`"running" or "stopped"`,
			map[string]schema.Attribute{
				"memory": schema.Int64Attribute{
					Optional:      true,
					Description:   "Memory limit in MiB (cgroup), at least 32. Unset: unlimited.",
					PlanModifiers: []planmodifier.Int64{int64planmodifier.RequiresReplace()},
				},
				"cpus": schema.Float64Attribute{
					Optional:      true,
					Description:   "CPU limit in CPUs (cgroup quota), at least 0.01. Unset: unlimited.",
					PlanModifiers: []planmodifier.Float64{float64planmodifier.RequiresReplace()},
				},
				"disk_mb": schema.Int64Attribute{
					Optional:      true,
					Description:   "Disk quota of the machine's writable layer in MiB (df inside shows it), at least 64. Unset: none.",
					PlanModifiers: []planmodifier.Int64{int64planmodifier.RequiresReplace()},
				},
				"ip_address": schema.StringAttribute{
					Computed:      true,
					Description:   "The machine's address on the bridge.",
					PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
				},
			}),
	}
}

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// Validate reports bad values at plan time, before any machine is made.
func (m *machineModel) Validate(diags *diag.Diagnostics) {
	tfmachine.ValidHostname(Name, m.Hostname, hostnameRE.MatchString, "letters, digits and '-' in dot-separated labels", diags)
	if v := m.Memory; !v.IsNull() && !v.IsUnknown() && v.ValueInt64() < 32 {
		diags.AddAttributeError(path.Root("memory"), "kloudlocal: memory too small",
			fmt.Sprintf("memory = %d MiB: at least 32 (cloud-init alone needs more); leave it unset for no limit", v.ValueInt64()))
	}
	if v := m.DiskMB; !v.IsNull() && !v.IsUnknown() && v.ValueInt64() < 64 {
		diags.AddAttributeError(path.Root("disk_mb"), "kloudlocal: disk too small",
			fmt.Sprintf("disk_mb = %d MiB: at least 64; leave it unset for no quota", v.ValueInt64()))
	}
	if v := m.CPUs; !v.IsNull() && !v.IsUnknown() && v.ValueFloat64() < 0.01 {
		diags.AddAttributeError(path.Root("cpus"), "kloudlocal: cpus too small",
			fmt.Sprintf("cpus = %g: at least 0.01; leave it unset for no limit", v.ValueFloat64()))
	}
}

func (m *machineModel) Request(tags map[string]string) CreateRequest {
	return CreateRequest{
		Hostname: m.Hostname.ValueString(),
		UserData: m.UserData.ValueString(),
		MemoryMB: m.Memory.ValueInt64(),
		CPUs:     m.CPUs.ValueFloat64(),
		DiskMB:   m.DiskMB.ValueInt64(),
		Tags:     tags,
	}
}

func (m *machineModel) Created(in Machine) {
	m.ID = types.StringValue(in.ID)
	m.IPAddress = types.StringValue(in.IPAddress)
	m.State = types.StringValue(in.State)
}

func (m *machineModel) Retagged(in Machine) {
	m.State = types.StringValue(in.State)
	m.IPAddress = types.StringValue(in.IPAddress)
}

// Fill copies what the service reports into the model. Unset limits stay null, so a machine
// without limits shows no drift.
func (st *machineModel) Fill(ctx context.Context, m Machine) diag.Diagnostics {
	st.ID = types.StringValue(m.ID)
	if m.Hostname != "" {
		st.Hostname = types.StringValue(m.Hostname)
	}
	if m.MemoryMB != 0 || !st.Memory.IsNull() {
		st.Memory = types.Int64Value(m.MemoryMB)
	}
	if m.CPUs != 0 || !st.CPUs.IsNull() {
		st.CPUs = types.Float64Value(m.CPUs)
	}
	if m.DiskMB != 0 || !st.DiskMB.IsNull() {
		st.DiskMB = types.Int64Value(m.DiskMB)
	}
	diags := tfmachine.FillTags(ctx, &st.Tags, m.Tags)
	st.IPAddress = types.StringValue(m.IPAddress)
	st.State = types.StringValue(m.State)
	return diags
}

var (
	_ resource.ResourceWithConfigure      = (*tfmachine.Resource[machineModel, *machineModel, CreateRequest, Machine])(nil)
	_ resource.ResourceWithValidateConfig = (*tfmachine.Resource[machineModel, *machineModel, CreateRequest, Machine])(nil)
	_ resource.ResourceWithImportState    = (*tfmachine.Resource[machineModel, *machineModel, CreateRequest, Machine])(nil)
)
