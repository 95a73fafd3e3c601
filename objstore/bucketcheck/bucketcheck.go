// Package bucketcheck is the contract test of provider.BucketProvisioner: Run drives a
// provisioner through its four calls (each twice, concurrently, after a change of access, after
// retain) and checks what the S3 server itself does with the keys it hands out, with
// aws-sdk-go-v2 as an independent client against each Bucket's Endpoint: a read key lists and
// reads and gets 403 AccessDenied writing, a revoked key gets 403, retained data is still there,
// deleted data is gone. objstore/seaweed runs it against a real SeaweedFS and e2e/providertest
// against plugins. Start at Run.
package bucketcheck

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/kloud-dev/kloud/objstore/s3client"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/ptype"
)

// ApplyTimeout is how long a grant or revoke may take to reach the S3 server (servers apply
// identity changes asynchronously; SeaweedFS within about a second).
const ApplyTimeout = 15 * time.Second

// Run checks p. prefix begins the names of the buckets it makes (2 to 40 characters of a bucket
// name; Run adds a random suffix): give each Run its own. Run deletes what it made. The
// provisioner must tag what it provisions so that its Buckets lists them.
func Run(t *testing.T, p provider.BucketProvisioner, prefix string) {
	t.Helper()
	c := &checker{p: p, prefix: prefix}
	t.Run("BadNames", c.badNames)
	t.Run("Lifecycle", c.lifecycle)
	t.Run("ConcurrentProvision", c.concurrent)
	t.Run("GrantMissingBucket", c.grantMissing)
}

type checker struct {
	p      provider.BucketProvisioner
	prefix string
}

// name returns a fresh bucket name.
func (c *checker) name(what string) string {
	return c.prefix + "-" + what + "-" + strings.ToLower(strings.ReplaceAll(time.Now().Format("150405.000000"), ".", ""))
}

// cleanup deletes bucket when the test ends.
func (c *checker) cleanup(t *testing.T, bucket string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.p.Delete(ctx, bucket, false); err != nil {
			t.Errorf("cleanup: Delete %s: %v", bucket, err)
		}
	})
}

// badNames: names that break S3's rules and unsafe user names are refused with an error that
// says so, and nothing is made.
func (c *checker) badNames(t *testing.T) {
	ctx := t.Context()
	for _, name := range []string{"ab", "Upper-case", "under_score", "-dash-first", "dot..dot", "192.168.1.2", "xn--punycode", strings.Repeat("a", 64)} {
		_, _, err := c.p.Provision(ctx, ptype.BucketClaim{Name: name, Owner: "alice"})
		if err == nil || !strings.Contains(err.Error(), "bucket name") {
			t.Errorf("Provision %q: %v, want a bucket name error", name, err)
		}
		if _, err := c.p.Grant(ctx, name, "bob", ptype.BucketRead); err == nil || errors.Is(err, provider.ErrBucketNotFound) {
			t.Errorf("Grant on %q: %v, want a bucket name error", name, err)
		}
		if err := c.p.Revoke(ctx, name, "bob"); err == nil {
			t.Errorf("Revoke on %q: no error", name)
		}
		if err := c.p.Delete(ctx, name, false); err == nil {
			t.Errorf("Delete of %q: no error", name)
		}
	}
	good := c.name("bad")
	for _, user := range []string{"", "a b", "a/b", "a:b", "-x", strings.Repeat("u", 65), "semi;colon", "new\nline"} {
		if _, _, err := c.p.Provision(ctx, ptype.BucketClaim{Name: good, Owner: user}); err == nil {
			c.cleanup(t, good)
			t.Errorf("Provision owned by %q: no error", user)
		}
		if _, err := c.p.Grant(ctx, good, user, ptype.BucketRead); err == nil {
			t.Errorf("Grant to %q: no error", user)
		}
	}
	if _, err := c.p.Grant(ctx, good, "bob", "admin"); err == nil {
		t.Errorf("Grant of access %q: no error", "admin")
	}
	bs, err := c.p.Buckets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if strings.HasPrefix(b.Name, c.prefix+"-bad") {
			t.Errorf("bucket %s made by a refused call", b.Name)
		}
	}
}

// lifecycle: Provision twice → one bucket, one key; the owner writes; Grant read twice → the
// same key, which lists and reads and is refused writes (403); Grant write → it writes; Grant
// read → refused again; Revoke → 403, Revoke again ok; Delete retain → keys refused, data kept
// (a new Provision finds it); Delete → gone, twice.
func (c *checker) lifecycle(t *testing.T) {
	ctx := t.Context()
	name := c.name("life")
	c.cleanup(t, name)
	claim := ptype.BucketClaim{Name: name, Owner: "alice", Tags: map[string]string{provider.TagStack: "stack-1", provider.TagOwner: "alice"}}
	b, k, err := c.p.Provision(ctx, claim)
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	b2, k2, err := c.p.Provision(ctx, claim)
	if err != nil {
		t.Fatalf("Provision again: %v", err)
	}
	if b.Name != name || b2.Name != name || b.Endpoint == "" || b2.Endpoint != b.Endpoint || k != k2 || k.User != "alice" || k.Access != ptype.BucketWrite || k.AccessKey == "" || k.SecretKey == "" {
		t.Fatalf("Provision twice: %+v %+v and %s/%s %s/%s, want one bucket and one write key of alice", b, b2, k.User, k.AccessKey, k2.User, k2.AccessKey)
	}
	owner := s3client.ForKey(b, k)
	waitFor(t, "the owner's key writes", func() error { return s3client.Put(ctx, owner, name, "a/hello.txt", "hello") })
	if got, err := s3client.Get(ctx, owner, name, "a/hello.txt"); err != nil || got != "hello" {
		t.Fatalf("owner reads %q, %v", got, err)
	}
	c.listed(t, name, true)

	rk, err := c.p.Grant(ctx, name, "bob", ptype.BucketRead)
	if err != nil {
		t.Fatalf("Grant read: %v", err)
	}
	rk2, err := c.p.Grant(ctx, name, "bob", ptype.BucketRead)
	if err != nil || rk2 != rk || rk.User != "bob" || rk.Access != ptype.BucketRead || rk.AccessKey == k.AccessKey {
		t.Fatalf("Grant read twice: %s %s, %v; want one read key of bob", rk.AccessKey, rk2.AccessKey, err)
	}
	reader := s3client.ForKey(b, rk)
	start := time.Now()
	waitFor(t, "the read key reads", func() error { _, err := s3client.Get(ctx, reader, name, "a/hello.txt"); return err })
	t.Logf("grant applied after %s", time.Since(start).Round(time.Millisecond))
	if keys, err := list(ctx, reader, name); err != nil || len(keys) != 1 || keys[0] != "a/hello.txt" {
		t.Fatalf("the read key lists %q, %v", keys, err)
	}
	if err := s3client.Put(ctx, reader, name, "b.txt", "no"); !Denied(err) {
		t.Fatalf("the read key writes: %v, want 403 AccessDenied", err)
	}

	wk, err := c.p.Grant(ctx, name, "bob", ptype.BucketWrite)
	if err != nil || wk.Access != ptype.BucketWrite || wk.User != "bob" {
		t.Fatalf("Grant write: %+v, %v", wk.Access, err)
	}
	writer := s3client.ForKey(b, wk)
	waitFor(t, "bob's write key writes", func() error { return s3client.Put(ctx, writer, name, "b.txt", "bob") })
	if _, err := c.p.Grant(ctx, name, "bob", ptype.BucketRead); err != nil {
		t.Fatalf("Grant read after write: %v", err)
	}
	waitFor(t, "bob's key is refused writes again", func() error { return denied(s3client.Put(ctx, writer, name, "c.txt", "no")) })
	if _, err := s3client.Get(ctx, writer, name, "b.txt"); err != nil {
		t.Fatalf("bob reads after going back to read: %v", err)
	}

	if err := c.p.Revoke(ctx, name, "bob"); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	start = time.Now()
	waitFor(t, "the revoked key is refused", func() error { _, err := s3client.Get(ctx, writer, name, "a/hello.txt"); return denied(err) })
	t.Logf("revoke applied after %s", time.Since(start).Round(time.Millisecond))
	if _, err := list(ctx, writer, name); !Denied(err) {
		t.Errorf("the revoked key lists: %v, want 403", err)
	}
	if err := c.p.Revoke(ctx, name, "bob"); err != nil {
		t.Errorf("Revoke again: %v", err)
	}
	if err := c.p.Revoke(ctx, name, "carol"); err != nil {
		t.Errorf("Revoke of a user who had no key: %v", err)
	}
	if _, err := s3client.Get(ctx, owner, name, "a/hello.txt"); err != nil {
		t.Fatalf("the owner's key after bob's revoke: %v", err)
	}

	// Retain: every key goes, the data stays; the bucket is no longer this instance's.
	if err := c.p.Delete(ctx, name, true); err != nil {
		t.Fatalf("Delete retain: %v", err)
	}
	if err := c.p.Delete(ctx, name, true); err != nil {
		t.Fatalf("Delete retain again: %v", err)
	}
	waitFor(t, "the owner's key is refused after retain", func() error { _, err := s3client.Get(ctx, owner, name, "a/hello.txt"); return denied(err) })
	c.listed(t, name, false)
	b3, k3, err := c.p.Provision(ctx, claim)
	if err != nil {
		t.Fatalf("Provision of the retained bucket: %v", err)
	}
	owner = s3client.ForKey(b3, k3)
	waitFor(t, "the retained data is there", func() error {
		got, err := s3client.Get(ctx, owner, name, "a/hello.txt")
		if err == nil && got != "hello" {
			t.Fatalf("retained object holds %q", got)
		}
		return err
	})

	// Delete: the bucket and its objects go.
	if err := c.p.Delete(ctx, name, false); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := c.p.Delete(ctx, name, false); err != nil {
		t.Fatalf("Delete again: %v", err)
	}
	if _, err := c.p.Grant(ctx, name, "bob", ptype.BucketRead); !errors.Is(err, provider.ErrBucketNotFound) {
		t.Fatalf("Grant on a deleted bucket: %v, want ErrBucketNotFound", err)
	}
	c.listed(t, name, false)
	b4, k4, err := c.p.Provision(ctx, claim)
	if err != nil {
		t.Fatalf("Provision after Delete: %v", err)
	}
	owner = s3client.ForKey(b4, k4)
	waitFor(t, "the new bucket's owner lists", func() error { _, err := list(ctx, owner, name); return err })
	if keys, _ := list(ctx, owner, name); len(keys) != 0 {
		t.Fatalf("a bucket made again after Delete holds %q", keys)
	}
}

// concurrent: 8 Provisions of one claim at once end with one bucket and one key.
func (c *checker) concurrent(t *testing.T) {
	ctx := t.Context()
	name := c.name("conc")
	c.cleanup(t, name)
	claim := ptype.BucketClaim{Name: name, Owner: "alice"}
	var wg sync.WaitGroup
	keys := make([]ptype.BucketKey, 8)
	errs := make([]error, 8)
	for i := range keys {
		wg.Go(func() { _, keys[i], errs[i] = c.p.Provision(ctx, claim) })
	}
	wg.Wait()
	for i := range keys {
		if errs[i] != nil {
			t.Fatalf("Provision %d: %v", i, errs[i])
		}
		if keys[i] != keys[0] {
			t.Fatalf("Provision %d: key %s, Provision 0: %s", i, keys[i].AccessKey, keys[0].AccessKey)
		}
	}
	bs, err := c.p.Buckets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range bs {
		if strings.HasPrefix(b.Name, name) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d buckets named %s*, want 1", n, name)
	}
}

// grantMissing: Grant on a bucket that does not exist is ErrBucketNotFound; Revoke and Delete
// of it succeed.
func (c *checker) grantMissing(t *testing.T) {
	ctx := t.Context()
	name := c.name("none")
	if _, err := c.p.Grant(ctx, name, "bob", ptype.BucketRead); !errors.Is(err, provider.ErrBucketNotFound) {
		t.Errorf("Grant: %v, want ErrBucketNotFound", err)
	}
	if err := c.p.Revoke(ctx, name, "bob"); err != nil {
		t.Errorf("Revoke: %v", err)
	}
	for _, retain := range []bool{true, false} {
		if err := c.p.Delete(ctx, name, retain); err != nil {
			t.Errorf("Delete (retain %v): %v", retain, err)
		}
	}
}

// listed checks whether Buckets lists name.
func (c *checker) listed(t *testing.T, name string, want bool) {
	t.Helper()
	bs, err := c.p.Buckets(t.Context())
	if err != nil {
		t.Fatalf("Buckets: %v", err)
	}
	for _, b := range bs {
		if b.Name == name {
			if !want {
				t.Fatalf("Buckets lists %s", name)
			}
			if b.Tags[provider.TagStack] != "stack-1" {
				t.Errorf("Buckets: %s's tags %v, want the claim's", name, b.Tags)
			}
			return
		}
	}
	if want {
		t.Fatalf("Buckets does not list %s: %v", name, bs)
	}
}

// Denied reports whether err is the S3 server's 403 (AccessDenied).
func Denied(err error) bool {
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == 403
}

// denied is nil for a 403, else an error saying what happened instead.
func denied(err error) error {
	if Denied(err) {
		return nil
	}
	if err == nil {
		return errors.New("allowed")
	}
	return err
}

// waitFor polls f every 100 ms until it returns nil, for ApplyTimeout.
func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(ApplyTimeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %v", what, ApplyTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func list(ctx context.Context, c *s3.Client, bucket string) ([]string, error) {
	out, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys, nil
}
