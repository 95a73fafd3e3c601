package provider

import (
	"context"
	"errors"
)

// BucketProvisioner provisions object buckets for stacks' bucket claims (Provider.Buckets;
// capability CapBucket): the four calls of Kubernetes' object bucket provisioners. Kloud records
// every claim, bucket and grant in its store and calls these again after a crash or a restart, so
// each call must be idempotent and safe to repeat at any point of an earlier, interrupted call:
//
//   - Provision of a claim whose bucket exists (by name) returns that bucket and the owner's
//     key, the same key as before; it never makes a second bucket, and two concurrent calls for
//     one claim end with one bucket.
//   - Grant of a user who has a key to the bucket returns that key, with access changed to the
//     one asked for.
//   - Revoke of a user without a key, or of a bucket that is gone, succeeds.
//   - Delete of a bucket that is gone succeeds. With retain the data stays where it is (and
//     every user's key is revoked); without, the bucket and its objects are removed.
//
// Keys are the server's own: the S3 server itself refuses a revoked key and a read-only key's
// writes (a provisioner that cannot enforce that must not advertise CapBucket).
type BucketProvisioner interface {
	Provision(ctx context.Context, claim BucketClaim) (Bucket, BucketKey, error)
	Grant(ctx context.Context, bucket, user string, access BucketAccess) (BucketKey, error)
	Revoke(ctx context.Context, bucket, user string) error
	Delete(ctx context.Context, bucket string, retain bool) error
	// Buckets lists the buckets the provisioner made for this kloud instance (the claim's
	// TagInstance), with their tags: kloud gc removes those no claim holds.
	Buckets(ctx context.Context) ([]Bucket, error)
}

// ErrBucketNotFound is returned (wrapped) by Grant for a bucket that does not exist. Kloud maps
// it to kite.ErrNotFound (kloud/errors.go).
var ErrBucketNotFound = errors.New("no such bucket")
