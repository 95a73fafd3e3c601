package providertest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/kloud-dev/kloud/objstore/bucketcheck"
	"github.com/kloud-dev/kloud/provider"
)

// Bucket (capability "bucket"): the provider's bucket provisioner, as kloud has it registered
// (in process, or kloud's proxy of a plugin, over the plugin's connection), passes the bucket
// contract of objstore/bucketcheck against its real S3 server: every call twice, a read key
// reads and lists and is refused writes by the server itself, a revoked key is refused, a crash
// between the server's change and kloud's record is completed, concurrent Provisions of one
// claim make one bucket, Delete with retain keeps the data and without removes it, bad names are
// refused. The buckets are named with a prefix of this run, so a server shared by several runs
// is fine.
func (s *suite) testBucket(t *testing.T) {
	s.needCap(t, provider.CapBucket)
	if s.p.Buckets == nil {
		t.Fatalf("provider %s advertises %q but has no Buckets", s.p.Name, provider.CapBucket)
	}
	b := make([]byte, 3)
	rand.Read(b)
	bucketcheck.Run(t, s.p.Buckets, "conf-"+hex.EncodeToString(b))
}
