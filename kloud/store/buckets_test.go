package store_test

import (
	"errors"
	"testing"

	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
)

// A claim is recorded once per (stack, label): Ensure again keeps its bucket, state and grants;
// grants are set and removed one user at a time; Delete of a missing claim is no error.
func TestBucketClaimsRepo(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, b backend) {
		ctx := ctxT(t)
		s := b.open(t, store.Options{})
		r := s.BucketClaims()
		c := model.BucketClaim{ID: model.BucketClaimID("s1", "cache"), StackID: "s1", Label: "cache", Bucket: model.BucketName("s1", "cache"),
			Provider: "dummy", Owner: "alice", Team: "t", MaxBytes: 1 << 20}
		got, err := r.Ensure(ctx, c)
		if err != nil || got.State != model.BucketProvisioning || got.Bucket != "k-s1-cache" || got.CreatedAt.IsZero() {
			t.Fatalf("Ensure: %+v %v", got, err)
		}
		if err := r.Set(ctx, c.ID, store.BucketClaimSet{State: new(model.BucketReady), Endpoint: new("http://127.0.0.1:1"), Region: new("us-east-1")}); err != nil {
			t.Fatal(err)
		}
		if err := r.SetGrant(ctx, c.ID, "bob", "read"); err != nil {
			t.Fatal(err)
		}
		if err := r.SetGrant(ctx, c.ID, "carol", "write"); err != nil {
			t.Fatal(err)
		}
		c.Retain, c.MaxBytes = true, 0
		got, err = r.Ensure(ctx, c)
		if err != nil || got.State != model.BucketReady || !got.Retain || got.MaxBytes != 0 || got.Endpoint != "http://127.0.0.1:1" ||
			len(got.Grants) != 2 || got.Grants["bob"] != "read" || got.Grants["carol"] != "write" {
			t.Fatalf("Ensure again: %+v %v", got, err)
		}
		if err := r.RemoveGrant(ctx, c.ID, "bob"); err != nil {
			t.Fatal(err)
		}
		if err := r.RemoveGrant(ctx, c.ID, "bob"); err != nil {
			t.Fatalf("remove a grant twice: %v", err)
		}
		if _, err := r.Ensure(ctx, model.BucketClaim{ID: model.BucketClaimID("s2", "x"), StackID: "s2", Label: "x"}); err != nil {
			t.Fatal(err)
		}
		cs, err := r.ByStack(ctx, "s1")
		if err != nil || len(cs) != 1 || len(cs[0].Grants) != 1 || cs[0].Grants["carol"] != "write" {
			t.Fatalf("ByStack: %+v %v", cs, err)
		}
		if cs, err := r.ByStacks(ctx, []string{"s1", "s2", "s3"}); err != nil || len(cs) != 2 {
			t.Fatalf("ByStacks: %+v %v", cs, err)
		}
		if err := r.Delete(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
		if err := r.Delete(ctx, c.ID); err != nil {
			t.Fatalf("delete twice: %v", err)
		}
		if _, err := r.Get(ctx, c.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after Delete: %v", err)
		}
		if err := r.Set(ctx, c.ID, store.BucketClaimSet{State: new(model.BucketReady)}); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Set of a missing claim: %v", err)
		}
	})
}
