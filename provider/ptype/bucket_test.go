package ptype

import (
	"strings"
	"testing"
)

func TestValidBucketName(t *testing.T) {
	for _, ok := range []string{"abc", "kloud-stack1-cache", "a.b.c", "0123", strings.Repeat("a", 63)} {
		if err := ValidBucketName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for bad, why := range map[string]string{
		"b1": "3 to 63", strings.Repeat("a", 64): "3 to 63", "Abc": "lower-case", "-abc": "beginning",
		"abc-": "ending", "a_b": "lower-case", "a..b": "adjacent dots", "192.168.5.4": "IP address",
		"xn--abc": "reserved", "abc-s3alias": "reserved", "sthree-x": "reserved", "a b": "lower-case",
	} {
		err := ValidBucketName(bad)
		if err == nil || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: got %v, want an error naming it and saying %q", bad, err, why)
		}
	}
	if err := BucketAccess("admin").Valid(); err == nil {
		t.Error(`access "admin" accepted`)
	}
}
