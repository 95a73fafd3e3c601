package tfmachine

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/tfsdk"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// Model is a machine resource's data in Terraform and in state: a pointer to the provider's
// model struct (tfsdk tags), which says how it maps to the service's create request Req and
// machine M.
type Model[T, Req, M any] interface {
	*T
	// MachineID is the id attribute; HostnameValue the hostname attribute (for messages).
	MachineID() string
	HostnameValue() string
	// TagsValue is the tags attribute.
	TagsValue() types.Map
	// Request is the create request of the planned machine, with its tags.
	Request(tags map[string]string) Req
	// Created sets the computed attributes from the machine Create returned; the plan's
	// values stay (user_data is not reported back).
	Created(m M)
	// Retagged sets the computed attributes from the machine SetTags returned.
	Retagged(m M)
	// Fill copies what the service reports into the model, so drift shows in the plan.
	Fill(ctx context.Context, m M) diag.Diagnostics
	// Validate reports bad values of the configuration at plan time.
	Validate(diags *diag.Diagnostics)
}

// Resource is the machine resource (<provider>_machine) of a machine service's provider: create,
// read (a machine gone is removed from state), update of tags only (every other argument
// replaces the machine), delete and import by id, each a request to the service.
type Resource[T any, P Model[T, Req, M], Req, M any] struct {
	// Name is the provider's name, for messages ("kloudlocal").
	Name string
	// MachineSchema is the resource's schema; NotFound what the service client's Read wraps
	// for a machine that does not exist.
	MachineSchema schema.Schema
	NotFound      error

	c *Conn[Req, M]
}

func (r *Resource[T, P, Req, M]) Metadata(ctx context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_machine"
}

func (r *Resource[T, P, Req, M]) Schema(ctx context.Context, req resource.SchemaRequest, resp *resource.SchemaResponse) {
	resp.Schema = r.MachineSchema
}

func (r *Resource[T, P, Req, M]) Configure(ctx context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	if req.ProviderData == nil {
		return // not configured yet (validation)
	}
	c, ok := req.ProviderData.(*Conn[Req, M])
	if !ok {
		resp.Diagnostics.AddError(r.Name+": internal error", fmt.Sprintf("provider data of type %T", req.ProviderData))
		return
	}
	r.c = c
}

// ValidateConfig reports bad values at plan time, before any machine is made.
func (r *Resource[T, P, Req, M]) ValidateConfig(ctx context.Context, req resource.ValidateConfigRequest, resp *resource.ValidateConfigResponse) {
	var m T
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	P(&m).Validate(&resp.Diagnostics)
}

func (r *Resource[T, P, Req, M]) api() (*Client[Req, M], error) {
	if r.c == nil {
		return nil, errors.New("the " + r.Name + " provider is not configured")
	}
	return r.c.API()
}

// open reads the plan or the state (get) into a new model and returns it with the service
// client, or ok false with the reason in diags. verb names the operation for messages
// ("create", "read", ...).
func (r *Resource[T, P, Req, M]) open(ctx context.Context, get func(context.Context, any) diag.Diagnostics, verb string, diags *diag.Diagnostics) (p P, api *Client[Req, M], ok bool) {
	p = P(new(T))
	diags.Append(get(ctx, p)...)
	if diags.HasError() {
		return nil, nil, false
	}
	api, err := r.api()
	if err != nil {
		diags.AddError(r.Name+": cannot "+verb+" machine "+r.label(p), err.Error())
		return nil, nil, false
	}
	return p, api, true
}

// label names a machine in messages: its id, or its hostname before it has one.
func (r *Resource[T, P, Req, M]) label(p P) string {
	if id := p.MachineID(); id != "" {
		return id
	}
	return p.HostnameValue()
}

// write is Create and Update: the planned machine's tags go to call (a request to the service
// that sets the computed attributes on success), then the model becomes the new state.
func (r *Resource[T, P, Req, M]) write(ctx context.Context, plan func(context.Context, any) diag.Diagnostics, state *tfsdk.State, verb string, diags *diag.Diagnostics, call func(api *Client[Req, M], p P, tags map[string]string) error) {
	p, api, ok := r.open(ctx, plan, verb, diags)
	if !ok {
		return
	}
	tags, d := TagsOf(ctx, p.TagsValue())
	diags.Append(d...)
	if diags.HasError() {
		return
	}
	if err := call(api, p, tags); err != nil {
		diags.AddError(r.Name+": "+verb+" machine "+r.label(p), err.Error())
		return
	}
	diags.Append(state.Set(ctx, p)...)
}

func (r *Resource[T, P, Req, M]) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	r.write(ctx, req.Plan.Get, &resp.State, "create", &resp.Diagnostics, func(api *Client[Req, M], p P, tags map[string]string) error {
		m, err := api.Create(ctx, p.Request(tags))
		if err == nil {
			p.Created(m)
		}
		return err
	})
}

func (r *Resource[T, P, Req, M]) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	p, api, ok := r.open(ctx, req.State.Get, "read", &resp.Diagnostics)
	if !ok {
		return
	}
	m, err := api.Read(ctx, p.MachineID())
	if r.NotFound != nil && errors.Is(err, r.NotFound) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		resp.Diagnostics.AddError(r.Name+": read machine "+p.MachineID(), err.Error())
		return
	}
	// What the machine really has, so drift shows in the plan.
	resp.Diagnostics.Append(p.Fill(ctx, m)...)
	resp.Diagnostics.Append(resp.State.Set(ctx, p)...)
}

// Update changes tags only: every other argument replaces the machine.
func (r *Resource[T, P, Req, M]) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	r.write(ctx, req.Plan.Get, &resp.State, "update", &resp.Diagnostics, func(api *Client[Req, M], p P, tags map[string]string) error {
		m, err := api.SetTags(ctx, p.MachineID(), tags)
		if err == nil {
			p.Retagged(m)
		}
		return err
	})
}

func (r *Resource[T, P, Req, M]) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	p, api, ok := r.open(ctx, req.State.Get, "destroy", &resp.Diagnostics)
	if !ok {
		return
	}
	if err := api.Delete(ctx, p.MachineID()); err != nil {
		resp.Diagnostics.AddError(r.Name+": destroy machine "+p.MachineID(), err.Error())
	}
}

// ImportState takes a machine id; Read fills in the rest (user_data stays unknown to Terraform).
func (r *Resource[T, P, Req, M]) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("id"), req.ID)...)
}

// TagsOf returns the tags of a tags attribute (nil when null or unknown).
func TagsOf(ctx context.Context, m types.Map) (map[string]string, diag.Diagnostics) {
	if m.IsNull() || m.IsUnknown() {
		return nil, nil
	}
	out := map[string]string{}
	diags := m.ElementsAs(ctx, &out, false)
	return maps.Clone(out), diags
}

// FillTags sets a tags attribute from the service's tags: left null when the machine has none
// and the configuration set none, so that shows no drift.
func FillTags(ctx context.Context, st *types.Map, tags map[string]string) diag.Diagnostics {
	if len(tags) == 0 && st.IsNull() {
		return nil
	}
	if tags == nil {
		tags = map[string]string{}
	}
	tv, diags := types.MapValueFrom(ctx, types.StringType, tags)
	*st = tv
	return diags
}

// ValidHostname reports a bad hostname attribute of provider name: ok is the provider's rule,
// described by rule.
func ValidHostname(name string, h types.String, ok func(string) bool, rule string, diags *diag.Diagnostics) {
	if h.IsNull() || h.IsUnknown() {
		return
	}
	if s := h.ValueString(); len(s) > 63 || !ok(s) {
		diags.AddAttributeError(path.Root("hostname"), name+": bad hostname",
			fmt.Sprintf("%q is not a valid host name: %s, at most 63 characters", s, rule))
	}
}
