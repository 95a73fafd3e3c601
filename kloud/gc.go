package kloud

// Garbage collection of the providers' resources (issue 13 §4): the collector (which resources
// kloud no longer wants, the sweep, the removal) is package kloud/gc; kloud builds it here
// (newGC; gcLeases: kloud's stack leases), answers gc.run to administrators (opsAPI) and runs
// the periodic sweep as a background task (GCOptions.Interval, `kloud serve --gc-interval`).

import (
	"context"
	"fmt"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/gc"
	"github.com/kloud-dev/kloud/kloud/stackbuild"
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
func (o *opsAPI) gcRun(ctx context.Context, c *Caller, _ *kite.Request, p *api.GCRunParams) (api.GCResult, error) {
	if !c.Admin {
		return api.GCResult{}, fmt.Errorf("gc.run is for kloud administrators: %w", kite.ErrPermission)
	}
	if p.Provider != "" {
		pr, err := o.providers.Lookup(p.Provider)
		if err != nil {
			return api.GCResult{}, fmt.Errorf("%w: %w", err, kite.ErrNotFound)
		}
		if !pr.Can(provider.CapResources) && !pr.Can(provider.CapBucket) {
			return api.GCResult{}, fmt.Errorf("provider %s lists neither its resources nor its buckets (no %q or %q capability): %w", p.Provider, provider.CapResources, provider.CapBucket, provider.ErrUnsupported)
		}
	}
	res, err := o.gc.Collect(ctx, p.DryRun, p.Provider)
	if err != nil {
		return api.GCResult{}, err
	}
	o.log.InfoContext(ctx, "gc.run", "by", c.Username, "dryRun", p.DryRun, "garbage", len(res.Garbage))
	return res, nil
}

// newGC is the collector over the store, providers, stack leases and terraformer of s.
func newGC(s *Server) *gc.Collector {
	take := func(ctx context.Context, name, kind, busy string) (string, func(), error) {
		return s.flow().TakeLease(ctx, name, kind, busy)
	}
	return gc.New(gc.Options{Store: s.store, Providers: s.providers, Leases: gcLeases(take),
		Terraformer: func() (gc.States, error) {
			tf, err := s.terraformer()
			if err != nil {
				return nil, err
			}
			return tf, nil
		},
		Exclusive: func(ctx context.Context, sweep func(ctx context.Context) error) error { // sweeps.go
			return s.sweeps().run(ctx, "gc", sweep)
		},
		Interval: s.opts.GC.Interval, Grace: s.opts.GC.Grace, Logger: s.log})
}

// gcLeases is a stack lease taker as the collector's Leases.
type gcLeases func(ctx context.Context, name, kind, busy string) (string, func(), error)

func (f gcLeases) Take(ctx context.Context, name, kind, busy string) (string, func(), error) {
	return f(ctx, name, kind, busy)
}

// runGC is the periodic sweep (a background task; gc.Collector.Run).
func (o *opsAPI) runGC(ctx context.Context) { o.gc.Run(ctx) }

// stateIDs returns the "id" attribute of every resource instance in state (stackbuild.StateIDs).
func stateIDs(st *tfjson.State) map[string]bool { return stackbuild.StateIDs(st) }

// CollectGarbage runs one sweep of the resources of provider only ("": every provider), as the
// periodic sweep does (removing, not a dry run). kloud serve runs it for the vagrant provider
// when a vagrant host registers: what a crash left on a host that was away goes then.
func (s *Server) CollectGarbage(ctx context.Context, only string) (api.GCResult, error) {
	return s.ops.gc.Collect(ctx, false, only)
}
