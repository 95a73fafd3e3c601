package stackbuild

import (
	"testing"

	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// TestAttrChanges: what a stack plan lists for a machine: real changes with both values, hidden
// attributes by name only, unknown values for in-place changes only, and no noise from unset
// collections (null in the state, empty in the plan).
func TestAttrChanges(t *testing.T) {
	t.Parallel()
	before := map[string]any{"memory": 512.0, "user_data": "old key", "dns": nil, "tags": map[string]any{"a": "1"}, "id": "x"}
	ch := tfapi.ResourceChange{
		After:        map[string]any{"memory": 640.0, "user_data": "new key", "dns": []any{}, "tags": map[string]any{"a": "1"}},
		AfterUnknown: map[string]any{"id": true},
	}
	got := attrChanges(before, ch, false)
	if len(got) != 2 || got[0].Name != "memory" || got[0].Before != 512.0 || got[0].After != 640.0 || got[1].Name != "user_data" || !got[1].Hidden || got[1].After != nil || got[1].Before != nil {
		t.Fatalf("replace: %+v", got)
	}
	got = attrChanges(before, ch, true)
	if len(got) != 3 || got[0].Name != "id" || !got[0].Unknown {
		t.Fatalf("in place: %+v", got)
	}
}
