package model

import "time"

// Bucket claim states (BucketClaim.State).
const (
	BucketProvisioning = "provisioning" // recorded; the provisioner's Provision may not have run
	BucketReady        = "ready"        // provisioned
	BucketDeleting     = "deleting"     // the provisioner's Delete may not have run
)

// BucketClaim is a stack's claim on an object bucket (collection buckets), one per (stack,
// label): a kloud_bucket block of its template (docs/buckets.md "Claims"). Keys are not kept:
// the provisioner returns the same key again (Provision and Grant are idempotent).
type BucketClaim struct {
	// ID is "<stackId>/<label>".
	ID      string `bson:"_id" json:"id"`
	StackID string `bson:"stackId" json:"stackId"`
	Label   string `bson:"label" json:"label"`
	// Bucket is the bucket's name at the server (BucketName).
	Bucket   string `bson:"bucket" json:"bucket"`
	Provider string `bson:"provider" json:"provider"`
	Owner    string `bson:"owner" json:"owner"`
	Team     string `bson:"team" json:"team"`
	Retain   bool   `bson:"retain" json:"retain"`
	MaxBytes int64  `bson:"maxBytes,omitempty" json:"maxBytes,omitempty"`
	State    string `bson:"state" json:"state"`
	// Endpoint and Region are where clients reach the bucket, as Provision said.
	Endpoint string `bson:"endpoint,omitempty" json:"endpoint,omitempty"`
	Region   string `bson:"region,omitempty" json:"region,omitempty"`
	// Grants are the users given access besides the owner: username → "read" or "write".
	Grants map[string]string `bson:"grants,omitempty" json:"grants,omitempty"`
	// ShareGrants are the access the shares of the stack's machines give: username → "read"
	// (a readonly share) or "write" (terminal, full). A user's access is the higher of the two.
	ShareGrants map[string]string `bson:"shareGrants,omitempty" json:"shareGrants,omitempty"`
	CreatedAt   time.Time         `bson:"createdAt" json:"createdAt"`
	UpdatedAt   time.Time         `bson:"updatedAt" json:"updatedAt"`
}

// BucketClaimID is the id of stack stackID's claim label.
func BucketClaimID(stackID, label string) string { return stackID + "/" + label }

// BucketName is the server name of stack stackID's bucket label: stable, and valid by S3's
// rules for a stack id of lower-case hex and a label of kloud_bucket's characters.
func BucketName(stackID, label string) string { return "k-" + stackID + "-" + label }

// Access is what user may do in the claim's bucket: the higher of a bucket.grant and the
// machines' shares ("write", "read", or "" for none; the owner is not asked about).
func (c BucketClaim) Access(user string) string {
	g, s := c.Grants[user], c.ShareGrants[user]
	switch {
	case g == "write" || s == "write":
		return "write"
	case g != "" || s != "":
		return "read"
	}
	return ""
}
