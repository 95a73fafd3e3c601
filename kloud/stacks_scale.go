package kloud

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
)

// stack.scale (issue 13 §1): a machine resource's count changes in the stack's own files (the
// stack then diverges from its template revision, Stack.Diverged), or, when the count is a
// variable the files declare, in the stack's variables (stackbuild.ScaleFiles); then the update
// job of stacks_update.go applies it.

// scale serves stack.scale: an update job with a machine resource's count changed.
func (a *stackAPI) scale(ctx context.Context, c *Caller, _ *kite.Request, p *api.StackScaleParams) (api.JobRef, error) {
	st, err := a.srv.loadStack(ctx, c, p.StackID)
	if err != nil {
		return api.JobRef{}, err
	}
	files, vars, err := stackbuild.ScaleFiles(st.Files, st.Variables, a.srv.resourceTypes(), p.Resource, p.Count)
	if err != nil {
		return api.JobRef{}, err
	}
	// A count that is a parameter changes as stack.update would change it (params.go): only
	// when mutable, and within its validation.
	changes := map[string]json.RawMessage{}
	for k, v := range vars {
		if old, ok := st.Variables[k]; (!ok || old != v) && json.Valid([]byte(v)) {
			changes[k] = json.RawMessage(v)
		}
	}
	if len(changes) > 0 {
		if vars, err = a.srv.updateParamValues(st, files, changes); err != nil {
			return api.JobRef{}, err
		}
	}
	ms, err := a.srv.flow().StackMachines(ctx, st.ID)
	if err != nil {
		return api.JobRef{}, err
	}
	have := 0
	for _, m := range ms {
		if m.Resource == p.Resource {
			have++
		}
	}
	diverged := st.Diverged || !sameFiles(files, st.Files)
	return a.startUpdate(ctx, c, st, updateParams{StackID: st.ID, Rev: st.TemplateRev, Diverged: diverged, Files: store.JSONTextOf(files), Variables: store.JSONTextOf(vars),
		What: fmt.Sprintf("scaling %s from %d to %s", p.Resource, have, machineCount(p.Count))})
}

// machineCount is "1 machine" or "n machines".
func machineCount(n int) string {
	if n == 1 {
		return "1 machine"
	}
	return strconv.Itoa(n) + " machines"
}

func sameFiles(a, b []model.File) bool {
	return slices.EqualFunc(a, b, func(x, y model.File) bool { return x == y })
}
