package kloud

// Garbage collection of the providers' resources (issue 13 §4, Juju's instance tags): every
// resource a provider creates carries kloud's tags (provider.TagStack, ...), and a provider with
// capability "resources" (provider.Provider.Inventory) lists this kloud instance's resources and
// removes one. gc.run (`kloud gc [--dry-run]`, administrators) and a periodic sweep
// (GCOptions.Interval, `kloud serve --gc-interval`) remove those kloud no longer wants:
//
//   - the stack named by the resource's kloud.stack tag no longer exists;
//   - the stack exists but has no machine record named by kloud.machine;
//   - the stack exists and has that machine, but the stack's Terraform state does not hold the
//     resource (no resource of the state has its id): a build that died between the provider's
//     create and Terraform's state write left it, and the next build makes a new one.
//
// A resource the provider marks Orphan (what is left of one it no longer has, e.g. a local
// machine's namespace after its record is gone) is garbage whatever its tags say.
//
// It never removes a resource younger than the grace period (GCOptions.Grace: a build may be
// creating it), nor one of a stack a job holds: it takes the stack's lease ("stack/ID", as
// builds do) before it decides about a stack that exists, and a stack in Building or Destroying
// is left alone. Resources of other kloud instances are never listed (the providers filter by
// their instance id).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// Defaults of GCOptions.
const (
	// DefaultGCInterval is how often kloud sweeps the providers' resources (the first sweep runs
	// a minute after the start).
	DefaultGCInterval = 10 * time.Minute
	// DefaultGCGrace is how old a resource must be before the collector may remove it.
	DefaultGCGrace = 10 * time.Minute
)

// GCOptions configure the garbage collection of the providers' resources (gc.go).
type GCOptions struct {
	// Interval of the periodic sweep: 0 takes DefaultGCInterval, a negative value disables it
	// (gc.run still works).
	Interval time.Duration
	// Grace: resources younger than this are never removed (0 takes DefaultGCGrace; a negative
	// value means none, for tests).
	Grace time.Duration
}

func (o *GCOptions) defaults() {
	if o.Interval == 0 {
		o.Interval = DefaultGCInterval
	}
	if o.Grace == 0 {
		o.Grace = DefaultGCGrace
	}
	if o.Grace < 0 {
		o.Grace = 0
	}
}

// gcRun serves gc.run.
func (s *Server) gcRun(ctx context.Context, c *Caller, _ *kite.Request, p *api.GCRunParams) (api.GCResult, error) {
	if !c.Admin {
		return api.GCResult{}, fmt.Errorf("gc.run is for kloud administrators: %w", kite.ErrPermission)
	}
	if p.Provider != "" {
		pr, err := s.providers.Lookup(p.Provider)
		if err != nil {
			return api.GCResult{}, fmt.Errorf("%w: %w", err, kite.ErrNotFound)
		}
		if !pr.Can(provider.CapResources) {
			return api.GCResult{}, fmt.Errorf("provider %s does not list its resources (no %q capability): %w", p.Provider, provider.CapResources, provider.ErrUnsupported)
		}
	}
	res, err := s.collectGarbage(ctx, p.DryRun, p.Provider)
	if err != nil {
		return api.GCResult{}, err
	}
	s.log.InfoContext(ctx, "gc.run", "by", c.Username, "dryRun", p.DryRun, "garbage", len(res.Garbage))
	return res, nil
}

// runGC is the periodic sweep (a background task).
func (s *Server) runGC(ctx context.Context) {
	if s.opts.GC.Interval < 0 {
		return
	}
	t := time.NewTimer(min(s.opts.GC.Interval, time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := s.collectGarbage(ctx, false, "")
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.WarnContext(ctx, "gc: sweep", "err", err)
		}
		for _, g := range res.Garbage {
			if g.Error != "" {
				s.log.WarnContext(ctx, "gc: could not remove a resource", "provider", g.Provider, "resource", g.Resource.String(), "reason", g.Reason, "err", g.Error)
			}
		}
		for _, pr := range res.Providers {
			if pr.Error != "" {
				s.log.WarnContext(ctx, "gc: could not list a provider's resources", "provider", pr.Name, "err", pr.Error)
			}
		}
		t.Reset(s.opts.GC.Interval)
	}
}

// collectGarbage lists the resources of every provider with CapResources (or of only), decides
// which are garbage and, unless dryRun, removes them.
func (s *Server) collectGarbage(ctx context.Context, dryRun bool, only string) (api.GCResult, error) {
	res := api.GCResult{DryRun: dryRun, Providers: []api.GCProvider{}, Garbage: []api.GCItem{}}
	type listed struct {
		prov string
		r    provider.Resource
	}
	byStack := map[string][]listed{}
	var stacks []string
	var orphans []listed
	for _, name := range s.providers.Names() {
		if only != "" && name != only {
			continue
		}
		p, err := s.providers.Lookup(name)
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
		if !l.r.CreatedAt.IsZero() && now.Sub(l.r.CreatedAt) < s.opts.GC.Grace {
			continue
		}
		res.Garbage = append(res.Garbage, s.gcRemove(ctx, l.prov, l.r, "left over: the provider no longer has what it belonged to", dryRun))
	}
	for _, stackID := range stacks {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		// Resources younger than the grace period may be a build's in progress: a later sweep
		// looks at them.
		var old []listed
		for _, l := range byStack[stackID] {
			if l.r.CreatedAt.IsZero() || now.Sub(l.r.CreatedAt) >= s.opts.GC.Grace {
				old = append(old, l)
			}
		}
		if len(old) == 0 {
			continue
		}
		verdicts, release, err := s.gcJudgeStack(ctx, stackID, dryRun)
		if err != nil {
			s.log.WarnContext(ctx, "gc: stack: keeping its resources", "stack", stackID, "err", err)
			continue
		}
		for _, l := range old {
			reason := verdicts(l.r)
			if reason == "" {
				continue
			}
			res.Garbage = append(res.Garbage, s.gcRemove(ctx, l.prov, l.r, reason, dryRun))
		}
		release()
	}
	return res, nil
}

// gcRemove removes garbage resource r of provider prov (unless dryRun) and says how it went.
func (s *Server) gcRemove(ctx context.Context, prov string, r provider.Resource, reason string, dryRun bool) api.GCItem {
	item := api.GCItem{Provider: prov, Resource: r, Reason: reason}
	if dryRun {
		return item
	}
	p, err := s.providers.Lookup(prov)
	if err == nil {
		err = p.Inventory.RemoveResource(ctx, r)
	}
	if err != nil {
		item.Error = err.Error()
		return item
	}
	item.Removed = true
	s.log.InfoContext(ctx, "gc: removed a resource", "provider", prov, "resource", r.String(), "stack", r.Tag(provider.TagStack), "reason", reason)
	return item
}

// gcJudgeStack returns, for the resources tagged with stack id, a function that says why one is
// garbage ("" if it is wanted), and a release function to call once they are removed. For a stack
// that exists it holds the stack's lease until release (unless dryRun), so no build starts
// meanwhile; a stack that is busy (a job holds its lease, or it is Building or Destroying) is an
// error: its resources are kept.
func (s *Server) gcJudgeStack(ctx context.Context, id string, dryRun bool) (func(provider.Resource) string, func(), error) {
	nop := func() {}
	st, err := s.store.Stacks().Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return func(provider.Resource) string { return fmt.Sprintf("stack %s no longer exists", id) }, nop, nil
	}
	if err != nil {
		return nil, nil, err
	}
	release := nop
	if !dryRun {
		if _, release, err = s.takeLease(ctx, "stack/"+id, "gc", "stack "+id+" is busy"); err != nil {
			return nil, nil, err
		}
		// Read again under the lease: a build may have ended (or started) since.
		if st, err = s.store.Stacks().Get(ctx, id); errors.Is(err, store.ErrNotFound) {
			return func(provider.Resource) string { return fmt.Sprintf("stack %s no longer exists", id) }, release, nil
		} else if err != nil {
			release()
			return nil, nil, err
		}
	}
	if slices.Contains(stackTransitional, st.State) {
		release()
		return nil, nil, fmt.Errorf("stack %s is %s", id, st.State)
	}
	ms, err := s.store.Machines().ByStack(ctx, id)
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
	if tf, err := s.terraformer(); err == nil {
		state, err := tf.State(ctx, "stack-"+id)
		switch {
		case errors.Is(err, kite.ErrNotFound):
			inState = map[string]bool{}
		case err != nil:
			s.log.WarnContext(ctx, "gc: terraform state of stack: not judging its resources by it", "stack", id, "err", err)
		default:
			inState = stateIDs(state)
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

// stateIDs returns the "id" attribute of every resource instance in state.
func stateIDs(st *tfjson.State) map[string]bool {
	out := map[string]bool{}
	for r := range stateResources(st) {
		if id, ok := r.AttributeValues["id"].(string); ok && id != "" {
			out[id] = true
		}
	}
	return out
}

// CollectGarbage runs one sweep of the resources of provider only ("": every provider), as the
// periodic sweep does (removing, not a dry run). kloud serve runs it for the vagrant provider
// when a vagrant host registers: what a crash left on a host that was away goes then.
func (s *Server) CollectGarbage(ctx context.Context, only string) (api.GCResult, error) {
	return s.collectGarbage(ctx, false, only)
}
