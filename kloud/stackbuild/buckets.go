package stackbuild

import (
	"context"
	"fmt"
	"slices"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/provider"
)

// BucketSpec is a kloud_bucket block of a stack's template, as the build provisions it
// (docs/buckets.md "Claims"): kloud's template build (Templates) resolves its provider.
type BucketSpec struct {
	Label    string
	Provider string // the provider whose Buckets provisions it
	Retain   bool
	MaxBytes int64
}

// Provisioner returns the bucket provisioner of provider name: an error says why there is
// none.
func (f *Flow) Provisioner(name string) (provider.BucketProvisioner, error) {
	p, err := f.d.Providers.Lookup(name)
	if err != nil {
		return nil, err
	}
	if p.Buckets == nil {
		return nil, fmt.Errorf("provider %s provisions no buckets", name)
	}
	return p.Buckets, nil
}

// Claims are the claims specs of stack stackID ask for (their ids, labels and max sizes): what
// the bucket quotas check.
func Claims(stackID string, specs []BucketSpec) []model.BucketClaim {
	out := make([]model.BucketClaim, 0, len(specs))
	for _, s := range specs {
		out = append(out, model.BucketClaim{ID: model.BucketClaimID(stackID, s.Label), StackID: stackID, Label: s.Label, Provider: s.Provider, MaxBytes: s.MaxBytes})
	}
	return out
}

// ProvisionBuckets provisions the buckets of stack st (build stage BuildBuckets): the claims
// checked against the bucket quotas of st's owner and team (the caller holds their quota
// lease until the claims are recorded), then for each spec, its claim is recorded
// (provisioning), the provider's Provision called, and the claim marked ready, each step one
// store write. Every step is idempotent: a build run again, or
// after a crash anywhere, makes the same calls and ends with the same buckets. Keys are not
// logged or kept.
//
// A claim of the stack whose block the template no longer has is ended as a destroy ends it
// (deleted, or kept with retain). The stage is entered only when there is something to do.
func (f *Flow) ProvisionBuckets(ctx context.Context, j Job, st *model.Stack, specs []BucketSpec) error {
	claims := f.d.Store.BucketClaims()
	had, err := claims.ByStack(ctx, st.ID)
	if err != nil {
		return fmt.Errorf("buckets: %w", err)
	}
	var stale []model.BucketClaim
	for _, c := range had {
		if !slices.ContainsFunc(specs, func(s BucketSpec) bool { return s.Label == c.Label }) {
			stale = append(stale, c)
		}
	}
	if len(specs) == 0 && len(stale) == 0 {
		return nil
	}
	j.Enter(ctx, BuildBuckets)
	if err := f.d.Quota.CheckBuckets(ctx, st, Claims(st.ID, specs)); err != nil {
		return err
	}
	for _, c := range stale {
		if err := f.DeleteBucket(ctx, c); err != nil {
			return err
		}
		j.Logf(ctx, "bucket %s: no longer in the template: %s %s", c.Label, c.Bucket, endedHow(c.Retain))
	}
	for _, s := range specs {
		bp, err := f.Provisioner(s.Provider)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", s.Label, err)
		}
		name := model.BucketName(st.ID, s.Label)
		if err := provider.ValidBucketName(name); err != nil {
			return fmt.Errorf("bucket %s: %w", s.Label, err)
		}
		c, err := claims.Ensure(ctx, model.BucketClaim{
			ID: model.BucketClaimID(st.ID, s.Label), StackID: st.ID, Label: s.Label,
			Bucket: name, Provider: s.Provider, Owner: st.Owner, Team: st.Team,
			Retain: s.Retain, MaxBytes: s.MaxBytes,
		})
		if err != nil {
			return fmt.Errorf("bucket %s: record the claim: %w", s.Label, err)
		}
		b, _, err := bp.Provision(ctx, provider.BucketClaim{Name: c.Bucket, Owner: c.Owner, MaxBytes: c.MaxBytes,
			Tags: provider.ResourceTags(st.ID, st.Team, st.Owner, "", "")})
		if err != nil {
			return fmt.Errorf("bucket %s: provision %s: %w", s.Label, c.Bucket, err)
		}
		if err := claims.Set(ctx, c.ID, store.BucketClaimSet{State: new(model.BucketReady), Endpoint: new(b.Endpoint), Region: new(b.Region)}); err != nil {
			return fmt.Errorf("bucket %s: record it ready: %w", s.Label, err)
		}
		j.Logf(ctx, "bucket %s: %s ready at %s", s.Label, c.Bucket, b.Endpoint)
	}
	return nil
}

// DeleteBuckets ends the claims of stack st (destroy, after its machines are gone): each claim
// marked deleting, the provider's Delete called (retain: the data stays, every key is
// revoked), the claim removed. A crash anywhere leaves a claim the next destroy finishes.
func (f *Flow) DeleteBuckets(ctx context.Context, j Job, st *model.Stack) error {
	claims := f.d.Store.BucketClaims()
	cs, err := claims.ByStack(ctx, st.ID)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if err := f.DeleteBucket(ctx, c); err != nil {
			return err
		}
		j.Logf(ctx, "bucket %s: %s %s", c.Label, c.Bucket, endedHow(c.Retain))
	}
	return nil
}

// DeleteBucket ends claim c: marked deleting, the provider's Delete (c.Retain says whether the
// data stays), the claim removed. A provider that is gone, or provisions no buckets any more,
// leaves the bucket to its owner and to kloud gc: the claim is removed.
func (f *Flow) DeleteBucket(ctx context.Context, c model.BucketClaim) error {
	claims := f.d.Store.BucketClaims()
	if err := claims.Set(ctx, c.ID, store.BucketClaimSet{State: new(model.BucketDeleting)}); err != nil {
		return fmt.Errorf("bucket %s: %w", c.Label, err)
	}
	if bp, err := f.Provisioner(c.Provider); err != nil {
		f.log.WarnContext(ctx, "bucket claim of a provider without buckets: claim forgotten, bucket left", "claim", c.ID, "bucket", c.Bucket, "err", err)
	} else if err := bp.Delete(ctx, c.Bucket, c.Retain); err != nil {
		return fmt.Errorf("bucket %s: delete %s: %w", c.Label, c.Bucket, err)
	}
	if err := claims.Delete(ctx, c.ID); err != nil {
		return fmt.Errorf("bucket %s: %w", c.Label, err)
	}
	return nil
}

// endedHow says what ending a claim did with its bucket.
func endedHow(retain bool) string {
	if retain {
		return "kept with its data (retain); its keys revoked"
	}
	return "deleted with its data"
}
