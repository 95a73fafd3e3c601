package ptype

import (
	"fmt"
	"regexp"
)

// BucketLabelMax is the longest name of a kloud_bucket block: the bucket's server name,
// "k-<stack id>-<label>", stays within S3's 63 characters.
const BucketLabelMax = 30

var bucketLabelRE = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,28}[a-z0-9])?$`)

// ValidBucketLabel checks the name of a template's kloud_bucket block (the claim's label): 1 to
// 30 lower-case letters, digits and '-', beginning with a letter and not ending with '-'.
func ValidBucketLabel(label string) error {
	if !bucketLabelRE.MatchString(label) {
		return fmt.Errorf("bucket label %q: a bucket's name is 1 to %d lower-case letters, digits and '-', beginning with a letter and not ending with '-'", label, BucketLabelMax)
	}
	return nil
}
