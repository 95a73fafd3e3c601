package api

import (
	"fmt"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// Buckets (kloud/buckets.go; docs/buckets.md "Claims"): the object buckets stacks claim with
// kloud_bucket blocks. bucket.list shows claims without keys; bucket.credentials gives the
// stack's owner their own key; bucket.grant and bucket.revoke give and take other users'
// access; bucket.delete ends a claim now (deleting or keeping the data).
const (
	MethodBucketList        = "bucket.list"
	MethodBucketCredentials = "bucket.credentials"
	MethodBucketGrant       = "bucket.grant"
	MethodBucketRevoke      = "bucket.revoke"
	MethodBucketDelete      = "bucket.delete"
)

// BucketRef names a stack's bucket claim: the stack and the kloud_bucket block's name.
type BucketRef struct {
	StackID string `json:"stackId"`
	Label   string `json:"label"`
}

// Validate implements kite.Validator.
func (p *BucketRef) Validate() error {
	if err := required("stackId", p.StackID); err != nil {
		return err
	}
	return ptype.ValidBucketLabel(p.Label)
}

// BucketListParams filter bucket.list: the claims of one stack, or (empty) of every stack the
// caller can see.
type BucketListParams struct {
	StackID string `json:"stackId,omitempty"`
}

// BucketView is a bucket claim as bucket.list shows it: never a key.
type BucketView struct {
	StackID  string `json:"stackId"`
	Label    string `json:"label"`
	Bucket   string `json:"bucket"`
	Provider string `json:"provider"`
	Owner    string `json:"owner"`
	Team     string `json:"team"`
	Endpoint string `json:"endpoint,omitempty"`
	Region   string `json:"region,omitempty"`
	Retain   bool   `json:"retain"`
	MaxBytes int64  `json:"maxBytes,omitempty"`
	// State is provisioning, ready or deleting.
	State string `json:"state"`
	// Grants are the users given access besides the owner: username → read or write.
	Grants map[string]string `json:"grants,omitempty"`
	// ShareGrants are the access shares of the stack's machines give (readonly → read,
	// terminal and full → write); a user has the higher of the two.
	ShareGrants map[string]string `json:"shareGrants,omitempty"`
}

// BucketListResult is bucket.list's result.
type BucketListResult struct {
	Buckets []BucketView `json:"buckets"`
}

// BucketCredentials is bucket.credentials' result: the caller's own key to the bucket. It is
// the only answer of kloud that carries a bucket key.
type BucketCredentials struct {
	StackID         string `json:"stackId"`
	Label           string `json:"label"`
	Bucket          string `json:"bucket"`
	Endpoint        string `json:"endpoint"`
	Region          string `json:"region"`
	Access          string `json:"access"`
	AccessKeyID     string `json:"accessKeyId"`
	SecretAccessKey string `json:"secretAccessKey"`
}

// BucketGrantParams are bucket.grant's params: user gets access (read or write) to the bucket.
type BucketGrantParams struct {
	BucketRef
	User   string `json:"user"`
	Access string `json:"access"`
}

// Validate implements kite.Validator.
func (p *BucketGrantParams) Validate() error {
	if err := p.BucketRef.Validate(); err != nil {
		return err
	}
	if err := required("user", p.User); err != nil {
		return err
	}
	if !nameRE.MatchString(p.User) {
		return fmt.Errorf("user %q: not a username", p.User)
	}
	return ptype.BucketAccess(p.Access).Valid()
}

// BucketRevokeParams are bucket.revoke's params: user loses access to the bucket.
type BucketRevokeParams struct {
	BucketRef
	User string `json:"user"`
}

// Validate implements kite.Validator.
func (p *BucketRevokeParams) Validate() error {
	if err := p.BucketRef.Validate(); err != nil {
		return err
	}
	if !nameRE.MatchString(p.User) {
		return fmt.Errorf("user %q: not a username", p.User)
	}
	return nil
}

// BucketDeleteParams are bucket.delete's params. Retain keeps the data (every key revoked);
// without it the bucket and its objects are removed. Either way the claim ends; the stack keeps
// working without the bucket (a later stack.apply claims it again while its template declares it).
type BucketDeleteParams struct {
	BucketRef
	Retain *bool `json:"retain,omitempty"` // nil: the claim's own retain
}

// Validate implements kite.Validator.
func (p *BucketDeleteParams) Validate() error { return p.BucketRef.Validate() }
