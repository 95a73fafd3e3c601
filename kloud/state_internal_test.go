package kloud

import (
	"maps"
	"slices"
	"testing"

	tfjson "github.com/hashicorp/terraform-json"
)

// TestStateResources: stateResources walks every module of a state (stateEmpty and gc's
// stateIDs use it); a nil state, one without values and one with only empty modules are empty.
func TestStateResources(t *testing.T) {
	t.Parallel()
	res := func(id string) *tfjson.StateResource {
		return &tfjson.StateResource{Address: "terraform_data." + id, AttributeValues: map[string]any{"id": id}}
	}
	st := &tfjson.State{Values: &tfjson.StateValues{RootModule: &tfjson.StateModule{
		Resources: []*tfjson.StateResource{res("a"), {Address: "terraform_data.noid"}},
		ChildModules: []*tfjson.StateModule{
			{Address: "module.m", Resources: []*tfjson.StateResource{res("b")}, ChildModules: []*tfjson.StateModule{
				{Address: "module.m.module.n", Resources: []*tfjson.StateResource{res("c")}},
			}},
		},
	}}}
	if got := slices.Sorted(maps.Keys(stateIDs(st))); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("stateIDs: %v, want a b c", got)
	}
	if stateEmpty(st) {
		t.Fatal("a state with resources is empty")
	}
	onlyChild := &tfjson.State{Values: &tfjson.StateValues{RootModule: &tfjson.StateModule{
		ChildModules: []*tfjson.StateModule{{Resources: []*tfjson.StateResource{res("d")}}},
	}}}
	if stateEmpty(onlyChild) {
		t.Fatal("a state with a resource in a child module only is empty")
	}
	emptyModules := &tfjson.State{Values: &tfjson.StateValues{RootModule: &tfjson.StateModule{ChildModules: []*tfjson.StateModule{{}}}}}
	for name, s := range map[string]*tfjson.State{"nil": nil, "no values": {}, "no root": {Values: &tfjson.StateValues{}}, "empty modules": emptyModules} {
		if !stateEmpty(s) || len(stateIDs(s)) != 0 {
			t.Errorf("%s state: empty %v, ids %v", name, stateEmpty(s), stateIDs(s))
		}
	}
}
