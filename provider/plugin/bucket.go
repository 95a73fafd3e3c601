package plugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/ptype"
)

// The wire of capability "bucket" (provider.BucketProvisioner, Provider.Buckets): kloud provisions
// a stack's bucket claims, grants and revokes its users' keys, deletes buckets and lists them for
// its garbage collector through the plugin. A plugin whose Provider has Buckets advertises the
// capability (Caps derives it) and serves the five methods; kloud's proxy of it gets a Buckets
// that calls them. Every call is idempotent at the provisioner (provider/bucket.go), so kloud
// may repeat one whose answer the connection lost. A Grant of a bucket the plugin does not have
// answers -32003 of type "bucketNotFound", which the proxy turns back into an error wrapping
// provider.ErrBucketNotFound.
const (
	MethodBucketProvision = "provider.bucket.provision"
	MethodBucketGrant     = "provider.bucket.grant"
	MethodBucketRevoke    = "provider.bucket.revoke"
	MethodBucketDelete    = "provider.bucket.delete"
	MethodBucketList      = "provider.bucket.list"
)

// Bounds of what a bucket call carries (one kite frame; kloud's names are far shorter).
const (
	maxBuckets      = 10000 // buckets in one provider.bucket.list
	maxBucketUser   = 128   // bytes of a user name
	maxBucketTags   = 50    // tags of one claim (S3's own limit on a bucket's tags)
	maxBucketTagLen = 256   // bytes of one tag's key or value
)

type bucketProvisionParams struct {
	Claim ptype.BucketClaim `json:"claim"`
}

// Validate implements kite.Validator.
func (p *bucketProvisionParams) Validate() error {
	if err := ptype.ValidBucketName(p.Claim.Name); err != nil {
		return fmt.Errorf("claim.name: %w", err)
	}
	if err := validBucketUser(p.Claim.Owner); err != nil {
		return fmt.Errorf("claim.owner: %w", err)
	}
	if p.Claim.MaxBytes < 0 {
		return fmt.Errorf("claim.maxBytes %d: cannot be negative", p.Claim.MaxBytes)
	}
	if len(p.Claim.Tags) > maxBucketTags {
		return fmt.Errorf("claim.tags: %d tags, at most %d", len(p.Claim.Tags), maxBucketTags)
	}
	for k, v := range p.Claim.Tags {
		if k == "" || len(k) > maxBucketTagLen || len(v) > maxBucketTagLen {
			return fmt.Errorf("claim.tags: tag %.40q: want a key of 1 to %d bytes and a value of at most %d", k, maxBucketTagLen, maxBucketTagLen)
		}
	}
	return nil
}

type bucketProvisionResult struct {
	Bucket ptype.Bucket    `json:"bucket"`
	Key    ptype.BucketKey `json:"key"`
}

type bucketGrantParams struct {
	Bucket string             `json:"bucket"`
	User   string             `json:"user"`
	Access ptype.BucketAccess `json:"access"`
}

// Validate implements kite.Validator.
func (p *bucketGrantParams) Validate() error {
	if err := validBucketRef(p.Bucket, p.User); err != nil {
		return err
	}
	return p.Access.Valid()
}

type bucketRevokeParams struct {
	Bucket string `json:"bucket"`
	User   string `json:"user"`
}

// Validate implements kite.Validator.
func (p *bucketRevokeParams) Validate() error { return validBucketRef(p.Bucket, p.User) }

type bucketDeleteParams struct {
	Bucket string `json:"bucket"`
	Retain bool   `json:"retain,omitempty"`
}

// Validate implements kite.Validator.
func (p *bucketDeleteParams) Validate() error {
	if err := ptype.ValidBucketName(p.Bucket); err != nil {
		return fmt.Errorf("bucket: %w", err)
	}
	return nil
}

type bucketListResult struct {
	Buckets []ptype.Bucket `json:"buckets"`
}

// validBucketRef checks a (bucket, user) pair of grant and revoke.
func validBucketRef(bucket, user string) error {
	if err := ptype.ValidBucketName(bucket); err != nil {
		return fmt.Errorf("bucket: %w", err)
	}
	if err := validBucketUser(user); err != nil {
		return fmt.Errorf("user: %w", err)
	}
	return nil
}

// validBucketUser checks a user name: non-empty, bounded, printable.
func validBucketUser(u string) error {
	switch {
	case u == "":
		return errors.New("required")
	case len(u) > maxBucketUser:
		return fmt.Errorf("%d bytes, at most %d", len(u), maxBucketUser)
	case strings.IndexFunc(u, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0:
		return fmt.Errorf("%q: no spaces or control characters", u)
	}
	return nil
}

const typeBucketNotFound = "bucketNotFound"

// errBucketNotFound carries provider.ErrBucketNotFound over the wire.
var errBucketNotFound = &kite.Error{Code: kite.CodeNotFound, Message: provider.ErrBucketNotFound.Error(), Data: &kite.ErrorData{Type: typeBucketNotFound}}

// bucketWireErr keeps provider.ErrBucketNotFound (and, through wireErr, ErrUnsupported)
// recognizable on the other side, with the provisioner's message.
func bucketWireErr(err error) error {
	if err != nil && errors.Is(err, provider.ErrBucketNotFound) {
		return fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+provider.ErrBucketNotFound.Error()), errBucketNotFound)
	}
	return wireErr(err)
}

// remoteBucket sets re to a missing bucket if the plugin's error ke is one (Host.call).
func remoteBucket(re *remoteError, ke *kite.Error) {
	if ke.Type() == typeBucketNotFound {
		re.is = provider.ErrBucketNotFound
	}
}

// ---- kloud's side: the proxy provisioner

// proxyBuckets is a plugin's provider.BucketProvisioner in kloud.
type proxyBuckets struct {
	h    *Host
	name string
}

func (b proxyBuckets) Provision(ctx context.Context, claim provider.BucketClaim) (provider.Bucket, provider.BucketKey, error) {
	var res bucketProvisionResult
	if err := b.h.call(ctx, b.name, MethodBucketProvision, &bucketProvisionParams{Claim: claim}, &res); err != nil {
		return provider.Bucket{}, provider.BucketKey{}, err
	}
	return res.Bucket, res.Key, nil
}

func (b proxyBuckets) Grant(ctx context.Context, bucket, user string, access provider.BucketAccess) (provider.BucketKey, error) {
	var key provider.BucketKey
	err := b.h.call(ctx, b.name, MethodBucketGrant, &bucketGrantParams{Bucket: bucket, User: user, Access: access}, &key)
	return key, err
}

func (b proxyBuckets) Revoke(ctx context.Context, bucket, user string) error {
	return b.h.call(ctx, b.name, MethodBucketRevoke, &bucketRevokeParams{Bucket: bucket, User: user}, nil)
}

func (b proxyBuckets) Delete(ctx context.Context, bucket string, retain bool) error {
	return b.h.call(ctx, b.name, MethodBucketDelete, &bucketDeleteParams{Bucket: bucket, Retain: retain}, nil)
}

func (b proxyBuckets) Buckets(ctx context.Context) ([]provider.Bucket, error) {
	var res bucketListResult
	if err := b.h.call(ctx, b.name, MethodBucketList, struct{}{}, &res); err != nil {
		return nil, err
	}
	if len(res.Buckets) > maxBuckets {
		return nil, fmt.Errorf("provider %s listed %d buckets, at most %d", b.name, len(res.Buckets), maxBuckets)
	}
	return res.Buckets, nil
}

var _ provider.BucketProvisioner = proxyBuckets{}

// setBuckets gives proxy p a Buckets if the plugin advertised "bucket".
func (h *Host) setBuckets(p *provider.Provider, name string, can func(provider.Capability) bool) {
	if can(provider.CapBucket) {
		p.Buckets = proxyBuckets{h: h, name: name}
	}
}

// ---- the plugin's side

// handleBuckets serves the methods on the plugin's side.
func (s *server) handleBuckets(k *kite.Kite) {
	k.Handle(MethodBucketProvision, kite.Typed(s.bucketProvision))
	k.Handle(MethodBucketGrant, kite.Typed(s.bucketGrant))
	k.Handle(MethodBucketRevoke, kite.Typed(s.bucketRevoke))
	k.Handle(MethodBucketDelete, kite.Typed(s.bucketDelete))
	k.Handle(MethodBucketList, kite.HandlerFunc(s.bucketList))
}

// buckets returns the provider's provisioner, or the error for a provider without one.
func (s *server) buckets(what string) (provider.BucketProvisioner, error) {
	if s.p.Buckets == nil {
		return nil, wireErr(fmt.Errorf("bucket %s: %w", what, provider.ErrUnsupported))
	}
	return s.p.Buckets, nil
}

func (s *server) bucketProvision(ctx context.Context, _ *kite.Request, p *bucketProvisionParams) (any, error) {
	bp, err := s.buckets("provision")
	if err != nil {
		return nil, err
	}
	b, key, err := bp.Provision(ctx, p.Claim)
	if err != nil {
		return nil, bucketWireErr(err)
	}
	return bucketProvisionResult{Bucket: b, Key: key}, nil
}

func (s *server) bucketGrant(ctx context.Context, _ *kite.Request, p *bucketGrantParams) (any, error) {
	bp, err := s.buckets("grant")
	if err != nil {
		return nil, err
	}
	key, err := bp.Grant(ctx, p.Bucket, p.User, p.Access)
	if err != nil {
		return nil, bucketWireErr(err)
	}
	return key, nil
}

func (s *server) bucketRevoke(ctx context.Context, _ *kite.Request, p *bucketRevokeParams) (any, error) {
	bp, err := s.buckets("revoke")
	if err != nil {
		return nil, err
	}
	if err := bp.Revoke(ctx, p.Bucket, p.User); err != nil {
		return nil, bucketWireErr(err)
	}
	return struct{}{}, nil
}

func (s *server) bucketDelete(ctx context.Context, _ *kite.Request, p *bucketDeleteParams) (any, error) {
	bp, err := s.buckets("delete")
	if err != nil {
		return nil, err
	}
	if err := bp.Delete(ctx, p.Bucket, p.Retain); err != nil {
		return nil, bucketWireErr(err)
	}
	return struct{}{}, nil
}

func (s *server) bucketList(ctx context.Context, _ *kite.Request) (any, error) {
	bp, err := s.buckets("list")
	if err != nil {
		return nil, err
	}
	bs, err := bp.Buckets(ctx)
	if err != nil {
		return nil, bucketWireErr(err)
	}
	if bs == nil {
		bs = []provider.Bucket{}
	}
	return bucketListResult{Buckets: bs}, nil
}
