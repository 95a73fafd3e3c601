package klientapi

import (
	"fmt"
	"regexp"
	"strings"
)

// MethodSetBuckets gives the machine its stack's object buckets (kloud's bucket claims,
// docs/buckets.md): klient writes one file per bucket for the owner's account,
// ~/.config/kloud/buckets/<label>.env (0600), and /etc/profile.d/kloud-buckets.sh, which login
// shells source. The list replaces the one before (files of buckets no longer listed go).
// kloud calls it over the agent's registration connection after a build and whenever the agent
// registers again; only kloud may (its own kite).
const MethodSetBuckets = "klient.setBuckets"

// FeatureBuckets is in Info.Features of a klient that serves klient.setBuckets.
const FeatureBuckets = "buckets"

// BucketEnv is one bucket as a machine sees it: where, and the owner's key.
type BucketEnv struct {
	Label           string `json:"label"`
	Bucket          string `json:"bucket"`
	Endpoint        string `json:"endpoint"`
	Region          string `json:"region"`
	AccessKeyID     string `json:"accessKeyId"`
	SecretAccessKey string `json:"secretAccessKey"`
}

// SetBucketsParams are klient.setBuckets' params.
type SetBucketsParams struct {
	Buckets []BucketEnv `json:"buckets"`
}

// SetBucketsResult is klient.setBuckets' result: the files written.
type SetBucketsResult struct {
	Files []string `json:"files"`
}

var bucketLabelRE = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,28}[a-z0-9])?$`)

// Validate implements kite.Validator: labels of kloud_bucket's characters, once each; values
// without line breaks or quotes (they go into shell files).
func (p *SetBucketsParams) Validate() error {
	if len(p.Buckets) > 64 {
		return fmt.Errorf("buckets: at most 64")
	}
	seen := map[string]bool{}
	for i, b := range p.Buckets {
		if !bucketLabelRE.MatchString(b.Label) || seen[b.Label] {
			return fmt.Errorf("buckets[%d]: label %q: lower-case letters, digits and '-', at most 30, once each", i, b.Label)
		}
		seen[b.Label] = true
		for name, v := range map[string]string{"bucket": b.Bucket, "endpoint": b.Endpoint, "region": b.Region,
			"accessKeyId": b.AccessKeyID, "secretAccessKey": b.SecretAccessKey} {
			if v == "" || len(v) > 1024 || strings.ContainsAny(v, "'\"\\\n\r\x00`$") {
				return fmt.Errorf("buckets[%d].%s: required, at most 1024 bytes, no quotes, backslashes, '$', '`' or line breaks", i, name)
			}
		}
	}
	return nil
}

// BucketEnvName is the prefix of bucket label's variables: KLOUD_BUCKET_<LABEL> with '-' as '_'.
func BucketEnvName(label string) string {
	return "KLOUD_BUCKET_" + strings.ToUpper(strings.ReplaceAll(label, "-", "_"))
}
