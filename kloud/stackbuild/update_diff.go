package stackbuild

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// The diff of an update: what it does per machine (stack.plan of a stack shows it; the job logs it).

// changeLabel is the machine label of a planned change ("" if it is not a machine's).
func (f *Flow) changeLabel(ch tfapi.ResourceChange) string {
	p := f.d.Providers.ByResourceType(ch.Type)
	if ch.Mode != "managed" || p == nil || strings.HasPrefix(ch.Name, "kloud_") || ch.Module != "" {
		return ""
	}
	if i, ok := Index(ch.Index); ok {
		return ch.Name + "." + strconv.Itoa(i)
	}
	return ch.Name
}

// diffMachines says per machine what the update does: planned are the machines of the new
// files, ms the stack's records, changes Terraform's plan against the stack's state (before).
func (f *Flow) diffMachines(st *model.Stack, planned []api.PlannedMachine, ms []model.Machine, changes []tfapi.ResourceChange, before *tfjson.State) api.StackUpdatePlan {
	byLabel := map[string]tfapi.ResourceChange{}
	for _, ch := range changes {
		if l := f.changeLabel(ch); l != "" {
			byLabel[l] = ch
		}
	}
	recs := map[string]*model.Machine{}
	for i := range ms {
		recs[ms[i].Label] = &ms[i]
	}
	up := api.StackUpdatePlan{StackID: st.ID, Summary: map[string]int{}}
	seen := map[string]bool{}
	for _, pm := range planned {
		seen[pm.Label] = true
		mc := api.MachineChange{Label: pm.Label, Provider: pm.Provider, Resource: pm.Resource}
		rec := recs[pm.Label]
		ch, has := byLabel[pm.Label]
		switch {
		case rec == nil:
			mc.Action, mc.Attributes, mc.Configured = api.UpdateAdd, VisibleAttrs(pm.Attributes), pm.Configured
		case !has:
			mc.Action, mc.MachineID = api.UpdateKeep, rec.ID
		default:
			mc.MachineID = rec.ID
			acts := ch.Actions
			switch {
			case slices.Contains(acts, "create"): // replace, or created again (gone from the state)
				mc.Action = api.UpdateReplace
			case slices.Contains(acts, "update"):
				mc.Action = api.UpdateChange
			case slices.Contains(acts, "delete"):
				mc.Action = api.UpdateRemove
			default:
				mc.Action = api.UpdateKeep
			}
			if mc.Action == api.UpdateReplace || mc.Action == api.UpdateChange {
				mc.Changes = attrChanges(stateValues(before, ch.Address), ch, mc.Action == api.UpdateChange)
			}
		}
		up.Machines = append(up.Machines, mc)
	}
	for _, m := range ms {
		if !seen[m.Label] {
			up.Machines = append(up.Machines, api.MachineChange{Label: m.Label, Provider: m.Provider, Resource: m.Resource, MachineID: m.ID, Action: api.UpdateRemove})
		}
	}
	sort.Slice(up.Machines, func(i, j int) bool { return up.Machines[i].Label < up.Machines[j].Label })
	for _, mc := range up.Machines {
		up.Summary[mc.Action]++
	}
	return up
}

// stateValues are the values of resource instance addr in state (nil if it has none).
func stateValues(state *tfjson.State, addr string) map[string]any {
	if state == nil || state.Values == nil || state.Values.RootModule == nil {
		return nil
	}
	for _, r := range state.Values.RootModule.Resources {
		if r.Address == addr {
			return r.AttributeValues
		}
	}
	return nil
}

// attrChanges lists the attributes that differ between before (the state) and the planned
// change's after. Values known only after apply are listed for in-place changes only (a
// replacement makes every computed attribute unknown). A change of hidden attributes is named.
func attrChanges(before map[string]any, ch tfapi.ResourceChange, unknowns bool) []api.AttrChange {
	after, _ := ch.After.(map[string]any)
	unknown, _ := ch.AfterUnknown.(map[string]any)
	keys := map[string]bool{}
	for k := range after {
		keys[k] = true
	}
	for k := range unknown {
		keys[k] = true
	}
	var out []api.AttrChange
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if u, _ := unknown[k].(bool); u {
			if unknowns && !HiddenAttr(k) {
				out = append(out, api.AttrChange{Name: k, Before: before[k], Unknown: true})
			}
			continue
		}
		if sameValue(before[k], after[k]) {
			continue
		}
		if HiddenAttr(k) {
			out = append(out, api.AttrChange{Name: k, Hidden: true})
			continue
		}
		out = append(out, api.AttrChange{Name: k, Before: before[k], After: after[k]})
	}
	return out
}

// sameValue compares two JSON values (nil, a missing value and an empty list or map are the
// same: Terraform's state and plan differ in that alone for unset collections).
func sameValue(a, b any) bool {
	if empty(a) || empty(b) {
		return empty(a) && empty(b)
	}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	if err1 != nil || err2 != nil {
		return reflect.DeepEqual(a, b)
	}
	return string(ja) == string(jb)
}

func empty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// describeChange is one line of the job's log for a machine's change.
func describeChange(mc api.MachineChange) string {
	var parts []string
	for _, c := range mc.Changes {
		parts = append(parts, c.String())
	}
	line := mc.Label + ": " + mc.Action
	if len(parts) > 0 {
		line += " (" + strings.Join(parts, "; ") + ")"
	}
	return line
}
