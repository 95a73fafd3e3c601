package stackbuild

import (
	"context"
	"errors"
	"fmt"
	"iter"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer/tfapi"
)

// Destroy is a stack.apply job destroying st (in Destroying, held by job j): its machines
// Terminating, terraform destroy (unless the template policy forbids it and terraform holds
// nothing), the agents' keys revoked, the stack and its machines deleted.
func (f *Flow) Destroy(ctx context.Context, j Job, st *model.Stack) (StackResult, error) {
	ms, err := f.StackMachines(ctx, st.ID)
	if err != nil {
		return StackResult{}, err
	}
	j.Enter(ctx, DestroyMachines)
	// A machine already Terminating is this job's, from an attempt before kloud restarted (no
	// other job terminates a machine of a stack that is Destroying); before issue 23's fix a
	// resumed destroy failed on it.
	from := append(SettledStates(), provider.Terminating)
	for i, m := range ms {
		// A machine a start or stop job is changing is not taken from under it.
		if !f.SetMachine(ctx, m.ID, from, store.MachineSet{State: new(string(provider.Terminating))}) {
			return StackResult{}, f.failDestroy(ctx, st, ms[:i], "", fmt.Errorf("machine %s is %s (a job is changing it); destroy again when it is done", m.Label, m.State))
		}
	}
	// Always ask terraform: a build may have created resources even if kloud never recorded its
	// run (it was killed right after submitting it). Terraformer knowing no files for the stack
	// means nothing was ever applied.
	tf, err := f.d.Terraformer()
	if err != nil {
		return StackResult{}, f.failDestroy(ctx, st, ms, "", err)
	}
	// The template policy holds for destroy too: terraform destroy evaluates the stack's files
	// (destroy-time provisioners, functions). A stack whose files break it is destroyed only once
	// an administrator trusts them, unless terraform holds nothing of it (then there is nothing a
	// destroy could run).
	var id string
	destroy := func() (string, error) {
		return tf.Destroy(ctx, tfapi.Request{ContentID: "stack-" + st.ID, TraceID: j.Doc().ID})
	}
	progress := func(ev tfapi.Event) {
		if ev.Type == tfapi.EventProgress {
			j.EnterAt(ctx, DestroyResources, ev.Percent)
		}
	}
	if perr := f.d.Policy.CheckDestroy(ctx, st.Team, FileMap(st.Files)); perr != nil {
		state, serr := tf.State(ctx, "stack-"+st.ID)
		if serr == nil && !StateEmpty(state) || serr != nil && !errors.Is(serr, kite.ErrNotFound) {
			return StackResult{}, f.failDestroy(ctx, st, ms, "", fmt.Errorf("destroy: %w", perr))
		}
		err = kite.ErrNotFound
	} else {
		j.Enter(ctx, DestroyResources)
		id, err = SubmitTF(ctx, j, destroy)
	}
	switch {
	case errors.Is(err, kite.ErrNotFound):
		j.Logf(ctx, "terraform never ran for this stack: nothing to destroy")
	case err != nil:
		return StackResult{}, f.failDestroy(ctx, st, ms, "", fmt.Errorf("terraform destroy: %w", err))
	default:
		err := waitErr(tf.Wait(ctx, id, progress))
		// A run that died with its process (terraformer restarted under it) is run again:
		// destroy converges on the state it left.
		for reruns := 0; err != nil && RunDied(err) && ctx.Err() == nil && reruns < maxReruns; reruns++ {
			j.Logf(ctx, "terraform's run %s died with its process (%v); running it again", id, err)
			if id, err = SubmitTF(ctx, j, destroy); err != nil {
				break
			}
			err = waitErr(tf.Wait(ctx, id, progress))
		}
		if err != nil {
			return StackResult{}, f.failDestroy(ctx, st, ms, id, fmt.Errorf("terraform destroy: %w", err))
		}
	}
	// Terraform destroyed everything: the rest is bookkeeping, done even if the job is
	// cancelled now (a cancel cannot bring the machines back).
	bctx := context.WithoutCancel(ctx)
	j.Enter(bctx, DestroyKeys)
	for _, m := range ms {
		if m.KiteID != "" {
			if err := f.d.Kontrol.Revoke(bctx, m.KiteID, "stack "+st.ID+" destroyed"); err != nil {
				f.log.WarnContext(ctx, "revoke machine key", "machine", m.ID, "err", err)
			}
		}
	}
	// The buckets after the machines (nothing writes to them any more), before the stack's
	// record: a destroy that fails here is run again and finishes them.
	j.Enter(bctx, DestroyBuckets)
	if err := f.DeleteBuckets(bctx, j, st); err != nil {
		return StackResult{}, f.failDestroy(bctx, st, ms, "", err)
	}
	if err := f.d.Store.Persist(bctx, "delete machines of stack "+st.ID, 0, func(ctx context.Context) error {
		return f.d.Store.Machines().DeleteByStack(ctx, st.ID)
	}); err != nil {
		return StackResult{}, err
	}
	if err := f.d.Store.Persist(bctx, "delete stack "+st.ID, 0, func(ctx context.Context) error {
		return f.d.Store.Stacks().Delete(ctx, st.ID)
	}); err != nil {
		return StackResult{}, err
	}
	ctx = bctx
	j.Enter(ctx, DestroyDone)
	return StackResult{StackID: st.ID, Destroyed: true}, nil
}

// StateEmpty reports whether a terraform state holds no resources.
func StateEmpty(st *tfjson.State) bool {
	for range StateResources(st) {
		return false
	}
	return true
}

// StateResources yields every resource instance of st, of every module (none if st is nil).
func StateResources(st *tfjson.State) iter.Seq[*tfjson.StateResource] {
	return func(yield func(*tfjson.StateResource) bool) {
		if st == nil || st.Values == nil {
			return
		}
		var walk func(m *tfjson.StateModule) bool
		walk = func(m *tfjson.StateModule) bool {
			if m == nil {
				return true
			}
			for _, r := range m.Resources {
				if !yield(r) {
					return false
				}
			}
			for _, c := range m.ChildModules {
				if !walk(c) {
					return false
				}
			}
			return true
		}
		walk(st.Values.RootModule)
	}
}

// failDestroy puts the stack Failed and its Terminating machines Unknown (terraform may have
// destroyed some of them; destroy can be run again). If ctx was cancelled, terraform's run
// tfJob is stopped first.
func (f *Flow) failDestroy(ctx context.Context, st *model.Stack, ms []model.Machine, tfJob string, reason error) error {
	if ctx.Err() != nil {
		reason = fmt.Errorf("destroy cancelled: %w", reason)
	}
	f.StopTF(ctx, tfJob)
	for _, m := range ms {
		f.SetMachine(ctx, m.ID, []provider.State{provider.Terminating}, store.MachineSet{State: new(string(provider.Unknown)), Reason: new(reason.Error())})
	}
	f.SetStack(ctx, st.ID, store.StackSet{State: new(model.StackFailed), Reason: new(reason.Error())})
	return reason
}
