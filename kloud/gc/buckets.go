package gc

import (
	"context"
	"fmt"
	"slices"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
)

// Buckets: a provider with capability "bucket" lists the buckets it made for this kloud
// instance (provider.BucketProvisioner.Buckets, tagged provider.TagStack); one that no stack's
// claim names (kloud's buckets collection) is garbage and is deleted with its data. A retained
// bucket is not listed (its provisioner untags it before kloud forgets its claim).
//
// The order makes it safe beside builds and destroys: a build records a claim before it
// provisions its bucket, and a destroy (or bucket.delete) deletes or untags a bucket before it
// removes the claim. So the collector lists the buckets, then (holding the stack's lease, as
// for machines) reads the stack's claims, then lists again: a bucket counts as garbage only if
// it was listed before the claims were read, no claim names it, and it is still listed after.

// collectBuckets adds the bucket garbage of every provider with Buckets (or of only) to res,
// removing it unless dryRun.
func (g *Collector) collectBuckets(ctx context.Context, dryRun bool, only string, res *api.GCResult) {
	for _, name := range g.o.Providers.Names() {
		if only != "" && name != only {
			continue
		}
		p, err := g.o.Providers.Lookup(name)
		if err != nil || p.Buckets == nil || !p.Can(provider.CapBucket) {
			continue
		}
		i := slices.IndexFunc(res.Providers, func(gp api.GCProvider) bool { return gp.Name == name })
		if i < 0 {
			res.Providers = append(res.Providers, api.GCProvider{Name: name})
			i = len(res.Providers) - 1
		}
		before, err := p.Buckets.Buckets(ctx)
		if err != nil {
			res.Providers[i].Error = fmt.Sprintf("list buckets: %s", err.Error())
			continue
		}
		res.Providers[i].Resources += len(before)
		byStack := map[string][]provider.Bucket{}
		var stacks []string
		for _, b := range before {
			st := b.Tags[provider.TagStack]
			if st == "" {
				continue // not kloud's to judge
			}
			if _, seen := byStack[st]; !seen {
				stacks = append(stacks, st)
			}
			byStack[st] = append(byStack[st], b)
		}
		for _, stackID := range stacks {
			if ctx.Err() != nil {
				return
			}
			res.Garbage = append(res.Garbage, g.stackBuckets(ctx, name, p.Buckets, stackID, byStack[stackID], dryRun)...)
		}
	}
}

// stackBuckets judges the buckets of stack stackID that provider prov listed (listed), under
// the stack's lease, and removes the garbage unless dryRun.
func (g *Collector) stackBuckets(ctx context.Context, prov string, bp provider.BucketProvisioner, stackID string, listed []provider.Bucket, dryRun bool) []api.GCItem {
	_, release, err := g.judgeStack(ctx, stackID, dryRun) // the lease; a busy stack keeps its buckets
	if err != nil {
		g.log.WarnContext(ctx, "gc: stack: keeping its buckets", "stack", stackID, "err", err)
		return nil
	}
	defer release()
	claims, err := g.o.Store.BucketClaims().ByStack(ctx, stackID)
	if err != nil {
		g.log.WarnContext(ctx, "gc: stack's bucket claims: keeping its buckets", "stack", stackID, "err", err)
		return nil
	}
	var unclaimed []provider.Bucket
	for _, b := range listed {
		if !slices.ContainsFunc(claims, func(c model.BucketClaim) bool { return c.Bucket == b.Name }) {
			unclaimed = append(unclaimed, b)
		}
	}
	if len(unclaimed) == 0 {
		return nil
	}
	after, err := bp.Buckets(ctx)
	if err != nil {
		g.log.WarnContext(ctx, "gc: list buckets again: keeping them", "provider", prov, "err", err)
		return nil
	}
	var out []api.GCItem
	for _, b := range unclaimed {
		if !slices.ContainsFunc(after, func(a provider.Bucket) bool { return a.Name == b.Name }) {
			continue // deleted or retained meanwhile
		}
		item := api.GCItem{Provider: prov, Resource: provider.Resource{ID: b.Name, Kind: "bucket", Name: b.Name, Tags: b.Tags},
			Reason: fmt.Sprintf("no claim of stack %s holds bucket %s", stackID, b.Name)}
		if !dryRun {
			if err := bp.Delete(ctx, b.Name, false); err != nil {
				item.Error = err.Error()
			} else {
				item.Removed = true
				g.log.InfoContext(ctx, "gc: removed a bucket", "provider", prov, "bucket", b.Name, "stack", stackID, "reason", item.Reason)
			}
		}
		out = append(out, item)
	}
	return out
}
