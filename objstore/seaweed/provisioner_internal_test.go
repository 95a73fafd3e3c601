package seaweed

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// TestKeys: a user's key to a bucket is derived from the admin secret, the bucket and the user:
// the same at every call, different for another bucket, user or admin secret, and shaped like
// an S3 key (20 upper-case characters, a 40-character secret).
func TestKeys(t *testing.T) {
	p, err := NewProvisioner(ProvisionerOptions{Endpoint: "http://127.0.0.1:1", Master: "127.0.0.1:2.3", Weed: "weed", AdminAccessKey: "AK", AdminSecretKey: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := NewProvisioner(ProvisionerOptions{Endpoint: "http://127.0.0.1:1", Master: "127.0.0.1:2.3", Weed: "weed", AdminAccessKey: "AK", AdminSecretKey: "other"})
	k := p.key("bkt-1", "alice", ptype.BucketWrite)
	if k != p.key("bkt-1", "alice", ptype.BucketWrite) {
		t.Fatal("two keys for one bucket and user")
	}
	if !regexp.MustCompile(`^KB[A-Z2-7]{18}$`).MatchString(k.AccessKey) || len(k.SecretKey) != 40 || k.User != "alice" || k.Access != ptype.BucketWrite {
		t.Fatalf("key %+v", k)
	}
	for _, o := range []ptype.BucketKey{p.key("bkt-2", "alice", ptype.BucketWrite), p.key("bkt-1", "bob", ptype.BucketWrite), q.key("bkt-1", "alice", ptype.BucketWrite)} {
		if o.AccessKey == k.AccessKey || o.SecretKey == k.SecretKey {
			t.Errorf("%+v shares a part of %+v", o, k)
		}
	}
}

// TestValidation: every call checks its names before it reaches the server (here there is
// none: a call that got that far would fail differently).
func TestValidation(t *testing.T) {
	p, err := NewProvisioner(ProvisionerOptions{Endpoint: "http://127.0.0.1:1", Master: "127.0.0.1:2.3", Weed: "/nonexistent/weed", AdminAccessKey: "AK", AdminSecretKey: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		what string
		err  error
		want string
	}{
		{"bad bucket", func() error {
			_, _, err := p.Provision(ctx, ptype.BucketClaim{Name: "B_1", Owner: "alice"})
			return err
		}(), "bucket name"},
		{"bad owner", func() error {
			_, _, err := p.Provision(ctx, ptype.BucketClaim{Name: "bkt-1", Owner: "a b"})
			return err
		}(), "bucket user"},
		{"health bucket", func() error {
			_, _, err := p.Provision(ctx, ptype.BucketClaim{Name: HealthBucket, Owner: "alice"})
			return err
		}(), "reserved"},
		{"negative size", func() error {
			_, _, err := p.Provision(ctx, ptype.BucketClaim{Name: "bkt-1", Owner: "alice", MaxBytes: -1})
			return err
		}(), "maxBytes"},
		{"bad tag", func() error {
			_, _, err := p.Provision(ctx, ptype.BucketClaim{Name: "bkt-1", Owner: "alice", Tags: map[string]string{"k": "a\nb"}})
			return err
		}(), "tag"},
		{"grant bad access", func() error { _, err := p.Grant(ctx, "bkt-1", "bob", "all"); return err }(), "bucket access"},
		{"grant bad user", func() error { _, err := p.Grant(ctx, "bkt-1", "bob/x", ptype.BucketRead); return err }(), "bucket user"},
		{"revoke bad bucket", p.Revoke(ctx, "..", "bob"), "bucket name"},
		{"delete bad bucket", p.Delete(ctx, "a", true), "bucket name"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %s", c.what, c.err, c.want)
		}
	}
	if _, err := NewProvisioner(ProvisionerOptions{Endpoint: "http://127.0.0.1:1"}); err == nil {
		t.Error("NewProvisioner without a master, weed and admin key: no error")
	}
	if _, err := Start(ctx, Options{Bin: "weed"}); err == nil || !strings.Contains(err.Error(), "required") {
		t.Errorf("Start without a directory: %v", err)
	}
}

// TestRedact: errors and logs show weed shell commands without their secret key.
func TestRedact(t *testing.T) {
	got := redact("s3.configure -user=u -access_key=AK -secret_key=SEKRIT -apply")
	if strings.Contains(got, "SEKRIT") || !strings.Contains(got, "-access_key=AK") {
		t.Fatal(got)
	}
}
