package ptype

import (
	"fmt"
	"net"
	"regexp"
	"strings"
)

// Object buckets (capability CapBucket; provider.BucketProvisioner): the value types that travel
// between kloud, providers and plugins. The names follow the bucket-claim idea of Kubernetes'
// object bucket provisioners: a claim asks for a bucket, Provision makes it and its owner's key,
// Grant gives another user a key to it, Revoke takes that away, Delete ends it.

// BucketAccess is what a key may do in its bucket.
type BucketAccess string

// Accesses.
const (
	BucketRead  BucketAccess = "read"  // list and read objects
	BucketWrite BucketAccess = "write" // list, read, write and delete objects
)

// Valid reports whether a is a known access.
func (a BucketAccess) Valid() error {
	if a != BucketRead && a != BucketWrite {
		return fmt.Errorf("bucket access %q: want %q or %q", a, BucketRead, BucketWrite)
	}
	return nil
}

// BucketClaim asks a provisioner for a bucket. Name is chosen by kloud (ValidBucketName) and is
// the claim's identity: a second Provision of the same name returns the same bucket and key.
type BucketClaim struct {
	// Name is the bucket's name at the server (S3's naming rules: ValidBucketName).
	Name string `json:"name"`
	// Owner is the user whose key Provision returns (write access).
	Owner string `json:"owner"`
	// Tags are kloud's tags (provider.TagStack, TagOwner, TagInstance, …): the provisioner keeps
	// them with the bucket where the server can, and lists them for kloud's garbage collector.
	Tags map[string]string `json:"tags,omitempty"`
	// MaxBytes, when > 0, is the most the bucket may hold, for a server that enforces it.
	MaxBytes int64 `json:"maxBytes,omitempty"`
}

// Bucket is a provisioned bucket and where its clients reach it.
type Bucket struct {
	Name string `json:"name"`
	// Endpoint is the S3 endpoint URL clients use, e.g. "http://10.200.0.1:8333".
	Endpoint string `json:"endpoint"`
	// Region is the region to sign requests for (S3 servers that have none take "us-east-1").
	Region string `json:"region"`
	// Tags are the tags the bucket was provisioned with (as far as the server keeps them).
	Tags map[string]string `json:"tags,omitempty"`
}

// BucketKey is an S3 access key for one user of one bucket. Secret is a secret: kloud shows it
// only to the user it belongs to.
type BucketKey struct {
	User      string       `json:"user"`
	Access    BucketAccess `json:"access"`
	AccessKey string       `json:"accessKey"`
	SecretKey string       `json:"secretKey"`
}

var bucketNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

// ValidBucketName checks name against S3's rules for bucket names: 3 to 63 characters, lower-case
// letters, digits, dots and hyphens, beginning and ending with a letter or digit, no two
// adjacent dots, not an IP address, no "xn--" prefix and no "-s3alias" or "--ol-s3" suffix.
func ValidBucketName(name string) error {
	bad := func(why string) error { return fmt.Errorf("bucket name %q: %s", name, why) }
	switch {
	case len(name) < 3 || len(name) > 63:
		return bad("want 3 to 63 characters")
	case !bucketNameRE.MatchString(name):
		return bad("only lower-case letters, digits, '.' and '-', beginning and ending with a letter or digit")
	case strings.Contains(name, ".."):
		return bad("two adjacent dots")
	case net.ParseIP(name) != nil:
		return bad("an IP address is not a bucket name")
	case strings.HasPrefix(name, "xn--") || strings.HasPrefix(name, "sthree-"):
		return bad(`"xn--" and "sthree-" prefixes are reserved`)
	case strings.HasSuffix(name, "-s3alias") || strings.HasSuffix(name, "--ol-s3"):
		return bad(`"-s3alias" and "--ol-s3" suffixes are reserved`)
	}
	return nil
}
