// Package gc is the garbage collection of the providers' resources (issue 13 §4, Juju's
// instance tags): every resource a provider creates carries kloud's tags (provider.TagStack,
// ...), and a provider with capability "resources" (provider.Provider.Inventory) lists this
// kloud instance's resources and removes one. gc.run (`kloud gc [--dry-run]`, administrators)
// and a periodic sweep ([Collector.Run]: kloud's GCOptions.Interval, `kloud serve
// --gc-interval`) remove those kloud no longer wants:
//
//   - the stack named by the resource's kloud.stack tag no longer exists;
//   - the stack exists but has no machine record named by kloud.machine;
//   - the stack exists and has that machine, but the stack's Terraform state does not hold the
//     resource (no resource of the state has its id): a build that died between the provider's
//     create and Terraform's state write left it, and the next build makes a new one. (When
//     only terraform's run died, with its terraformer, the build that runs it again removes
//     these at once: stackbuild's removeStrays; what a crash of kloud itself left comes here.)
//
// A resource the provider marks Orphan (what is left of one it no longer has, e.g. a local
// machine's namespace after its record is gone) is garbage whatever its tags say.
//
// It never removes a resource younger than the grace period (Options.Grace: a build may be
// creating it), nor one of a stack a job holds: it takes the stack's lease ("stack/ID", as
// builds do) before it decides about a stack that exists, and a stack in Building or Destroying
// is left alone. Resources of other kloud instances are never listed (the providers filter by
// their instance id).
//
// Start reading at [New] and [Options]: the collector gets what it needs of kloud through small
// interfaces (Leases: a stack's lease; Terraformer: a stack's state), never kloud's Server, and
// it does not import package kloud (a test keeps it so). kloud checks who calls gc.run
// (kloud/gc.go) and runs the sweep as one of its background tasks.
package gc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Options configure a Collector. Store, Providers, Leases and Terraformer are required.
type Options struct {
	Store     *store.Store       // the stacks and machines resources are judged by
	Providers *provider.Registry // the providers whose resources are swept
	Leases    Leases
	// Terraformer returns what reads a stack's Terraform state, or an error when none is
	// configured (then no resource is judged by the state).
	Terraformer func() (States, error)
	// Interval of the periodic sweep (Run): a negative or zero value disables it.
	Interval time.Duration
	// Grace: resources younger than this are never removed (0: none).
	Grace time.Duration
	// Exclusive, if set, runs each sweep (Collect, periodic or asked for) so that one runs at a
	// time across kloud's replicas (kloud's sweep lease "sweep/gc"); its error (another sweep
	// runs) is Collect's. Nil: sweeps run as called.
	Exclusive func(ctx context.Context, sweep func(ctx context.Context) error) error
	Logger    *slog.Logger // nil: discard
}

// Leases are the store leases of stacks (kloud/leases.go).
type Leases interface {
	// Take takes lease name for a new owner of kind; busy starts the error when someone else
	// holds it. release gives it back.
	Take(ctx context.Context, name, kind, busy string) (owner string, release func(), err error)
}

// States reads Terraform states (terraformer's client has it).
type States interface {
	// State is the content id's last state (kite.ErrNotFound when there is none).
	State(ctx context.Context, contentID string) (*tfjson.State, error)
}

// Collector sweeps the providers' resources kloud no longer wants.
type Collector struct {
	o   Options
	log *slog.Logger
}

// New returns the collector over o.
func New(o Options) *Collector {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Collector{o: o, log: log}
}

// Run is the periodic sweep (a background task, until ctx ends): the first a minute after the
// start (or after Interval, when shorter), then every Interval.
func (g *Collector) Run(ctx context.Context) {
	if g.o.Interval <= 0 {
		return
	}
	t := time.NewTimer(min(g.o.Interval, time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := g.Collect(ctx, false, "")
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, kite.ErrConflict) { // Exclusive: another replica sweeps now
			g.log.DebugContext(ctx, "gc: sweep skipped", "err", err)
		} else if err != nil {
			g.log.WarnContext(ctx, "gc: sweep", "err", err)
		}
		for _, it := range res.Garbage {
			if it.Error != "" {
				g.log.WarnContext(ctx, "gc: could not remove a resource", "provider", it.Provider, "resource", it.Resource.String(), "reason", it.Reason, "err", it.Error)
			}
		}
		for _, pr := range res.Providers {
			if pr.Error != "" {
				g.log.WarnContext(ctx, "gc: could not list a provider's resources", "provider", pr.Name, "err", pr.Error)
			}
		}
		t.Reset(g.o.Interval)
	}
}

// Collect lists the resources of every provider with CapResources (or of only), and the
// buckets of every provider with CapBucket (buckets.go), decides which are garbage and, unless
// dryRun, removes them.
func (g *Collector) Collect(ctx context.Context, dryRun bool, only string) (res api.GCResult, err error) {
	if g.o.Exclusive != nil {
		err = g.o.Exclusive(ctx, func(ctx context.Context) (err error) {
			res, err = g.collect(ctx, dryRun, only)
			return err
		})
		return res, err
	}
	return g.collect(ctx, dryRun, only)
}

// collect is Collect once it may run.
func (g *Collector) collect(ctx context.Context, dryRun bool, only string) (api.GCResult, error) {
	res := api.GCResult{DryRun: dryRun, Providers: []api.GCProvider{}, Garbage: []api.GCItem{}}
	type listed struct {
		prov string
		r    provider.Resource
	}
	byStack := map[string][]listed{}
	var stacks []string
	var orphans []listed
	for _, name := range g.o.Providers.Names() {
		if only != "" && name != only {
			continue
		}
		p, err := g.o.Providers.Lookup(name)
		if err != nil || p.Inventory == nil || !p.Can(provider.CapResources) {
			continue
		}
		gp := api.GCProvider{Name: name}
		if p.Available != nil {
			if err := p.Available(); err != nil {
				gp.Error = "unavailable: " + err.Error()
				res.Providers = append(res.Providers, gp)
				continue
			}
		}
		rs, err := p.Inventory.Resources(ctx)
		if err != nil {
			gp.Error = err.Error()
		}
		gp.Resources = len(rs)
		res.Providers = append(res.Providers, gp)
		for _, r := range rs {
			if r.Orphan {
				orphans = append(orphans, listed{name, r})
				continue
			}
			st := r.Tag(provider.TagStack)
			if st == "" {
				continue // not kloud's to judge
			}
			if _, seen := byStack[st]; !seen {
				stacks = append(stacks, st)
			}
			byStack[st] = append(byStack[st], listed{name, r})
		}
	}
	now := time.Now()
	for _, l := range orphans {
		if !l.r.CreatedAt.IsZero() && now.Sub(l.r.CreatedAt) < g.o.Grace {
			continue
		}
		res.Garbage = append(res.Garbage, g.remove(ctx, l.prov, l.r, "left over: the provider no longer has what it belonged to", dryRun))
	}
	g.collectBuckets(ctx, dryRun, only, &res) // buckets.go
	for _, stackID := range stacks {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		// Resources younger than the grace period may be a build's in progress: a later sweep
		// looks at them.
		var old []listed
		for _, l := range byStack[stackID] {
			if l.r.CreatedAt.IsZero() || now.Sub(l.r.CreatedAt) >= g.o.Grace {
				old = append(old, l)
			}
		}
		if len(old) == 0 {
			continue
		}
		verdicts, release, err := g.judgeStack(ctx, stackID, dryRun)
		if err != nil {
			g.log.WarnContext(ctx, "gc: stack: keeping its resources", "stack", stackID, "err", err)
			continue
		}
		for _, l := range old {
			reason := verdicts(l.r)
			if reason == "" {
				continue
			}
			res.Garbage = append(res.Garbage, g.remove(ctx, l.prov, l.r, reason, dryRun))
		}
		release()
	}
	return res, nil
}

// remove removes garbage resource r of provider prov (unless dryRun) and says how it went.
func (g *Collector) remove(ctx context.Context, prov string, r provider.Resource, reason string, dryRun bool) api.GCItem {
	item := api.GCItem{Provider: prov, Resource: r, Reason: reason}
	if dryRun {
		return item
	}
	p, err := g.o.Providers.Lookup(prov)
	if err == nil {
		err = p.Inventory.RemoveResource(ctx, r)
	}
	if err != nil {
		item.Error = err.Error()
		return item
	}
	item.Removed = true
	g.log.InfoContext(ctx, "gc: removed a resource", "provider", prov, "resource", r.String(), "stack", r.Tag(provider.TagStack), "reason", reason)
	return item
}

// busyStates are the states of a stack that a job is changing.
var busyStates = []string{model.StackBuilding, model.StackDestroying}

// judgeStack returns, for the resources tagged with stack id, a function that says why one is
// garbage ("" if it is wanted), and a release function to call once they are removed. For a stack
// that exists it holds the stack's lease until release (unless dryRun), so no build starts
// meanwhile; a stack that is busy (a job holds its lease, or it is Building or Destroying) is an
// error: its resources are kept.
func (g *Collector) judgeStack(ctx context.Context, id string, dryRun bool) (func(provider.Resource) string, func(), error) {
	nop := func() {}
	st, err := g.o.Store.Stacks().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return func(provider.Resource) string { return fmt.Sprintf("stack %s no longer exists", id) }, nop, nil
	}
	if err != nil {
		return nil, nil, err
	}
	release := nop
	if !dryRun {
		if _, release, err = g.o.Leases.Take(ctx, "stack/"+id, "gc", "stack "+id+" is busy"); err != nil {
			return nil, nil, err
		}
		// Read again under the lease: a build may have ended (or started) since.
		if st, err = g.o.Store.Stacks().Get(ctx, id); errors.Is(err, store.ErrNotFound) {
			return func(provider.Resource) string { return fmt.Sprintf("stack %s no longer exists", id) }, release, nil
		} else if err != nil {
			release()
			return nil, nil, err
		}
	}
	if slices.Contains(busyStates, st.State) {
		release()
		return nil, nil, fmt.Errorf("stack %s is %s", id, st.State)
	}
	ms, err := g.o.Store.Machines().ByStack(ctx, id)
	if err != nil {
		release()
		return nil, nil, err
	}
	machines := map[string]bool{}
	for _, m := range ms {
		machines[m.ID] = true
	}
	// The ids Terraform's state holds (nil: unknown, then no resource is judged by it).
	var inState map[string]bool
	if tf, err := g.o.Terraformer(); err == nil {
		state, err := tf.State(ctx, "stack-"+id)
		switch {
		case errors.Is(err, kite.ErrNotFound):
			inState = map[string]bool{}
		case err != nil:
			g.log.WarnContext(ctx, "gc: terraform state of stack: not judging its resources by it", "stack", id, "err", err)
		default:
			inState = stackbuild.StateIDs(state)
		}
	}
	return func(r provider.Resource) string {
		mid := r.Tag(provider.TagMachine)
		switch {
		case mid == "":
			return ""
		case !machines[mid]:
			return fmt.Sprintf("stack %s has no machine %s", id, mid)
		case inState != nil && !inState[r.ID]:
			return fmt.Sprintf("not in the Terraform state of stack %s (%s): a build that died left it", id, st.State)
		}
		return ""
	}, release, nil
}
