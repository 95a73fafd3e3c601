// Package machinemodel is what the Terraform providers of kloud's machine services (kloudlocal:
// providers/local/tfprovider, kloudvagrant: providers/vagrant/tfprovider) share in their machine
// resource: the attributes every such machine has (Base, embedded in each provider's model) and
// their schema (Attributes). Each provider adds its own (limits, image, addresses).
package machinemodel

import (
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// Base is the attributes every machine resource has. Embedded in a provider's model, it gives
// the model tfmachine.Model's MachineID, HostnameValue and TagsValue.
type Base struct {
	ID       types.String `tfsdk:"id"`
	Hostname types.String `tfsdk:"hostname"`
	UserData types.String `tfsdk:"user_data"`
	Tags     types.Map    `tfsdk:"tags"`
	State    types.String `tfsdk:"state"`
}

// MachineID is the id attribute.
func (b *Base) MachineID() string { return b.ID.ValueString() }

// HostnameValue is the hostname attribute.
func (b *Base) HostnameValue() string { return b.Hostname.ValueString() }

// TagsValue is the tags attribute.
func (b *Base) TagsValue() types.Map { return b.Tags }

// Attributes returns the schema of Base's attributes with the provider's descriptions of the
// machine's id, its hostname and its states, and extra (the provider's own attributes) added.
func Attributes(id, hostname, state string, extra map[string]schema.Attribute) map[string]schema.Attribute {
	a := map[string]schema.Attribute{
		"id": schema.StringAttribute{
			Computed:      true,
			Description:   id,
			PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
		},
		"hostname": schema.StringAttribute{
			Required:      true,
			Description:   hostname,
			PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
		},
		"user_data": schema.StringAttribute{
			Optional:      true,
			Sensitive:     true,
			Description:   "cloud-init user data (NoCloud seed). Changing it replaces the machine.",
			PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
		},
		"tags": schema.MapAttribute{
			Optional:    true,
			ElementType: types.StringType,
			Description: "Tags kept with the machine (kloud sets its stack and machine ids). Updated in place.",
		},
		"state": schema.StringAttribute{
			Computed:      true,
			Description:   state + " (kloud stops and starts machines outside Terraform).",
			PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
		},
	}
	for k, v := range extra {
		a[k] = v
	}
	return a
}
