package stackbuild

import (
	"context"
	"errors"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// StateIDs returns the "id" attribute of every resource instance in state.
func StateIDs(st *tfjson.State) map[string]bool {
	out := map[string]bool{}
	for r := range StateResources(st) {
		if id, ok := r.AttributeValues["id"].(string); ok && id != "" {
			out[id] = true
		}
	}
	return out
}

// removeStrays removes, whatever their age, the resources tagged with stack stackID that its
// Terraform state does not hold: what a terraform run that died with its process (RunDied)
// created before it could write them into the state. The run that is started again would make
// new ones, and these would run, owned by no stack, until kloud's gc swept them (its grace
// period protects a build in progress; this build is the one that made them, and it holds the
// stack's lease). A build and an update call it before they run terraform again. Only
// providers that list their resources (capability "resources") are swept; a provider that
// cannot be asked, or a state that cannot be read, leaves its resources to gc. It logs what it
// removed to the job.
func (f *Flow) removeStrays(ctx context.Context, j Job, tf Terraformer, stackID string) {
	state, err := tf.State(ctx, "stack-"+stackID)
	switch {
	case errors.Is(err, kite.ErrNotFound):
		state = nil // the dead run wrote no state: nothing of the stack is held
	case err != nil:
		f.log.WarnContext(ctx, "strays of a dead run: cannot read the stack's state; leaving them to gc", "stack", stackID, "err", err)
		return
	}
	held := StateIDs(state)
	for _, name := range f.d.Providers.Names() {
		p, err := f.d.Providers.Lookup(name)
		if err != nil || p.Inventory == nil || !p.Can(provider.CapResources) {
			continue
		}
		if p.Available != nil && p.Available() != nil {
			continue
		}
		rs, err := p.Inventory.Resources(ctx)
		if err != nil {
			f.log.WarnContext(ctx, "strays of a dead run: cannot list the provider's resources; leaving them to gc", "stack", stackID, "provider", name, "err", err)
			continue
		}
		for _, r := range rs {
			if r.Orphan || r.Tag(provider.TagStack) != stackID || r.Tag(provider.TagMachine) == "" || held[r.ID] {
				continue
			}
			if err := p.Inventory.RemoveResource(ctx, r); err != nil {
				j.Logf(ctx, "could not remove %s, which the dead run made and did not record (gc will): %v", r.String(), err)
				continue
			}
			j.Logf(ctx, "removed %s: the dead run made it and did not record it", r.String())
		}
	}
}
