package plugin_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/kloud-dev/kloud/objstore/bucketcheck"
	"github.com/kloud-dev/kloud/objstore/seaweed/seaweedtest"
	"github.com/kloud-dev/kloud/provider"
)

// TestBucketSeaweed: a plugin whose Buckets is the real SeaweedFS provisioner (objstore/seaweed,
// on seaweedtest's server) passes the bucket contract (objstore/bucketcheck) through kloud's
// proxy of it, over the plugin wire; the real provisioner's ErrBucketNotFound comes back as
// provider.ErrBucketNotFound.
func TestBucketSeaweed(t *testing.T) {
	srv := seaweedtest.Start(t)
	b := make([]byte, 3)
	rand.Read(b)
	suffix := hex.EncodeToString(b)

	e := startKloud(t)
	p := filesProvider("s3files", newSeen("a"), noUnavailable())
	p.Buckets = srv.Provisioner("plugin-test-" + suffix)
	e.run(p, e.pluginKey("s3files"))
	e.wait("s3files")
	px, err := e.reg.Lookup("s3files")
	if err != nil {
		t.Fatal(err)
	}
	if !px.Can(provider.CapBucket) || px.Buckets == nil {
		t.Fatalf("proxy: capabilities %v", px.Caps())
	}
	if _, err := px.Buckets.Grant(t.Context(), "pw-"+suffix+"-missing", "bob", provider.BucketRead); !errors.Is(err, provider.ErrBucketNotFound) {
		t.Errorf("Grant of a bucket SeaweedFS does not have: %v, want ErrBucketNotFound", err)
	}
	bucketcheck.Run(t, px.Buckets, "pw-"+suffix)
}
