package kloud_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/objstore/s3client"
	"github.com/kloud-dev/kloud/objstore/seaweed/seaweedtest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// s3As is an independent S3 client (aws-sdk-go-v2) with key k.
func s3As(k api.BucketCredentials) *s3.Client {
	return s3.NewFromConfig(aws.Config{Region: k.Region, BaseEndpoint: aws.String(k.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider(k.AccessKeyID, k.SecretAccessKey, "")},
		func(o *s3.Options) { o.UsePathStyle = true })
}

const bucketTemplate = `
resource "terraform_data" "vm" {
  input = "#!/bin/bash\necho hello"
}

resource "kloud_bucket" "cache" {
  retain = false
}

resource "kloud_bucket" "keep" {
  retain      = true
  max_size_mb = 16
}

resource "kloud_bucket" "scratch" {}
`

// A stack with three bucket claims on the real S3 server (SeaweedFS) and the dummy provider:
// the build provisions them before the machines and Terraform never sees the blocks; building
// again gives the same buckets and keys; the owner's key writes, a read grant reads but cannot
// write (403 from the server), a revoked key gets 403; a readonly machine share reads until
// unshared; bucket.delete ends a claim now; an update without a block ends its claim; destroy
// deletes the buckets without retain and keeps the other's data; no key shows in the job's log.
func TestBucketClaims(t *testing.T) {
	t.Parallel()
	srv := seaweedtest.Start(t)
	prov := srv.Provisioner("bucket-claims-" + strings.ToLower(t.Name()))
	f := newFlowProvider(t, dummy.Options{}, kloudtest.Options{}, func(p *provider.Provider) { p.Buckets = prov })
	f.credential()
	addUsers(t, f.Env, false, "bob")
	c, ctx := f.client(), t.Context()
	// Refused before anything runs, naming the line.
	for _, bad := range []struct{ src, want string }{
		{"resource \"terraform_data\" \"vm\" {}\nresource \"kloud_bucket\" \"c\" {\n  provider = \"nope\"\n}", `main.tf:2: resource "kloud_bucket" "c": provider "nope" provisions no buckets (providers that do: dummy)`},
		{"resource \"terraform_data\" \"vm\" {\n  input = kloud_bucket.c.id\n}\nresource \"kloud_bucket\" \"c\" {}", `main.tf:2: resource "terraform_data" "vm": input refers to a kloud_bucket`},
	} {
		if _, err := c.StackPlan(ctx, api.StackPlanParams{TemplateID: f.template(bad.src)}); !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("plan of %q: %v\nwant invalid params with %q", bad.src, err, bad.want)
		}
	}
	tid := f.template(bucketTemplate)
	sid, _ := f.stack(tid)

	apply := func(destroy bool) []string {
		t.Helper()
		job, err := c.StackApply(ctx, api.StackApplyParams{StackID: sid, Destroy: destroy})
		if err != nil {
			t.Fatal(err)
		}
		if last := f.follow(job.JobID); last.Status != "succeeded" {
			t.Fatalf("apply (destroy %v): %+v", destroy, last)
		}
		j, err := c.JobGet(ctx, api.JobRef{JobID: job.JobID})
		if err != nil {
			t.Fatal(err)
		}
		return j.Log
	}
	log1 := apply(false)
	list, err := c.BucketList(ctx, api.BucketListParams{StackID: sid})
	if err != nil || len(list.Buckets) != 3 {
		t.Fatalf("bucket.list: %+v %v", list, err)
	}
	byLabel := map[string]api.BucketView{}
	for _, b := range list.Buckets {
		byLabel[b.Label] = b
	}
	cache, keep := byLabel["cache"], byLabel["keep"]
	if cache.Bucket != model.BucketName(sid, "cache") || cache.State != model.BucketReady || cache.Retain || cache.Provider != "dummy" ||
		!keep.Retain || keep.MaxBytes != 16<<20 || keep.Endpoint == "" {
		t.Fatalf("claims: %+v", list.Buckets)
	}
	// Terraform never saw the blocks: terraformer's copy of the stack's files has none.
	err = filepath.WalkDir(filepath.Join(f.tfDir, "stacks"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".tf") || strings.HasSuffix(p, ".tf.json")) {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), `resource "kloud_bucket"`) || strings.Contains(string(b), `"kloud_bucket": {`) {
				t.Errorf("%s has a kloud_bucket block:\n%s", p, b)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := c.BucketCredentials(ctx, api.BucketRef{StackID: sid, Label: "Cache_1"}); !errors.Is(err, kite.ErrInvalidParams) {
		t.Fatalf("credentials of a bad label: %v (want invalid params)", err)
	}
	ownerKey, err := c.BucketCredentials(ctx, api.BucketRef{StackID: sid, Label: "cache"})
	if err != nil || ownerKey.AccessKeyID == "" || ownerKey.SecretAccessKey == "" || ownerKey.Bucket != cache.Bucket || ownerKey.Access != "write" {
		t.Fatalf("bucket.credentials: %+v %v", ownerKey, err)
	}
	keepKey, err := c.BucketCredentials(ctx, api.BucketRef{StackID: sid, Label: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range log1 {
		if strings.Contains(l, ownerKey.SecretAccessKey) || strings.Contains(l, keepKey.SecretAccessKey) || strings.Contains(l, ownerKey.AccessKeyID) {
			t.Fatalf("the job's log shows a key: %s", l)
		}
	}
	if err := s3client.Put(ctx, s3As(ownerKey), cache.Bucket, "a.txt", "from alice"); err != nil {
		t.Fatalf("owner's put: %v", err)
	}
	if err := s3client.Put(ctx, s3As(keepKey), keep.Bucket, "kept.txt", "still here"); err != nil {
		t.Fatalf("owner's put into keep: %v", err)
	}

	// The dummy's machine is a directory with no account for its owner: the build could not
	// deliver the buckets. Give it one; the next build (settling) delivers them into its home.
	root := filepath.Join(f.dir, sid, "vm")
	home := filepath.Join(root, "home", "alice")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	passwd := fmt.Sprintf("alice:x:%d:%d:alice:%s:/bin/sh\n", os.Geteuid(), os.Getegid(), home)
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}

	// Again: the same buckets, the same key, the data still there; the machine has them.
	log2 := apply(false)
	for _, l := range log2 {
		if strings.Contains(l, ownerKey.SecretAccessKey) || strings.Contains(l, keepKey.SecretAccessKey) {
			t.Fatalf("the second job's log shows a key: %s", l)
		}
	}
	env, err := os.ReadFile(filepath.Join(home, ".config", "kloud", "buckets", "cache.env"))
	if err != nil || !strings.Contains(string(env), "export KLOUD_BUCKET_CACHE_SECRET_ACCESS_KEY='"+ownerKey.SecretAccessKey+"'\n") ||
		!strings.Contains(string(env), "export KLOUD_BUCKET_CACHE_ENDPOINT='"+ownerKey.Endpoint+"'\n") || strings.Contains(string(env), "AWS_ACCESS_KEY_ID") {
		t.Fatalf("the machine's cache.env: %v\n%s\n(the job's log: %q)", err, env, log2)
	}
	if _, err := os.Stat(filepath.Join(root, "etc", "profile.d", "kloud-buckets.sh")); err != nil {
		t.Fatalf("the machine's profile script: %v", err)
	}
	// An agent that registers again gets them again (here: after a stop and a start).
	if err := os.Remove(filepath.Join(home, ".config", "kloud", "buckets", "cache.env")); err != nil {
		t.Fatal(err)
	}
	vm := f.machines(sid)["vm"]
	for _, power := range []func(context.Context, api.MachineRef) (api.JobRef, error){c.MachineStop, c.MachineStart} {
		job, err := power(ctx, api.MachineRef{MachineID: vm.ID})
		if err != nil {
			t.Fatal(err)
		}
		if last := f.follow(job.JobID); last.Status != "succeeded" {
			t.Fatalf("stop or start: %+v", last)
		}
	}
	// A minute: the push asks the provisioner for the owner's key again, and under CI's load
	// (40 on two cores) 20 s were not enough once (ci48).
	testutil.Eventually(t, time.Minute, func() bool {
		_, err := os.Stat(filepath.Join(home, ".config", "kloud", "buckets", "cache.env"))
		return err == nil
	}, "cache.env not delivered again after the agent registered again")
	again, err := c.BucketCredentials(ctx, api.BucketRef{StackID: sid, Label: "cache"})
	if err != nil || again != ownerKey {
		t.Fatalf("credentials after a second build: %+v %v (was %+v)", again, err, ownerKey)
	}
	if got, err := s3client.Get(ctx, s3As(ownerKey), cache.Bucket, "a.txt"); err != nil || got != "from alice" {
		t.Fatalf("after a second build: %q %v", got, err)
	}
	if bs, err := prov.Buckets(ctx); err != nil || len(bs) != 3 {
		t.Fatalf("the server's buckets of this instance: %+v %v", bs, err)
	}

	// A read grant reads and cannot write; revoked, its key gets 403.
	if _, err := c.BucketGrant(ctx, api.BucketGrantParams{BucketRef: api.BucketRef{StackID: sid, Label: "cache"}, User: "bob", Access: "read"}); err != nil {
		t.Fatal(err)
	}
	bob := api.NewClient(f.Dial("bob"))
	if _, err := bob.BucketCredentials(ctx, api.BucketRef{StackID: sid, Label: "keep"}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("bob's credentials to a bucket not granted to him: %v", err)
	}
	bobKey, err := bob.BucketCredentials(ctx, api.BucketRef{StackID: sid, Label: "cache"})
	if err != nil || bobKey.Access != "read" || bobKey.AccessKeyID == ownerKey.AccessKeyID {
		t.Fatalf("bob's credentials: %+v %v", bobKey, err)
	}
	if got, err := s3client.Get(ctx, s3As(bobKey), cache.Bucket, "a.txt"); err != nil || got != "from alice" {
		t.Fatalf("bob reads: %q %v", got, err)
	}
	if err := s3client.Put(ctx, s3As(bobKey), cache.Bucket, "b.txt", "from bob"); s3client.HTTPStatus(err) != 403 {
		t.Fatalf("bob's write with a read key: %v (want 403)", err)
	}
	if bl, err := bob.BucketList(ctx, api.BucketListParams{}); err != nil || len(bl.Buckets) != 1 || bl.Buckets[0].Label != "cache" {
		t.Fatalf("bob's bucket.list: %+v %v", bl, err)
	}
	if _, err := c.BucketRevoke(ctx, api.BucketRevokeParams{BucketRef: api.BucketRef{StackID: sid, Label: "cache"}, User: "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s3client.Get(ctx, s3As(bobKey), cache.Bucket, "a.txt"); s3client.HTTPStatus(err) != 403 {
		t.Fatalf("bob's revoked key: %v (want 403)", err)
	}
	if _, err := c.BucketRevoke(ctx, api.BucketRevokeParams{BucketRef: api.BucketRef{StackID: sid, Label: "cache"}, User: "bob"}); err != nil {
		t.Fatalf("revoke twice: %v", err)
	}

	// A readonly share of the stack's machine gives bob read access; unshared, his key gets 403.
	if _, err := c.MachineShare(ctx, api.ShareParams{MachineID: vm.ID, Username: "bob", Grant: model.GrantReadonly}); err != nil {
		t.Fatal(err)
	}
	if l, err := c.BucketList(ctx, api.BucketListParams{StackID: sid}); err != nil || len(l.Buckets) != 3 || l.Buckets[0].ShareGrants["bob"] != "read" {
		t.Fatalf("bucket.list after a readonly share: %+v %v", l, err)
	}
	shareKey, err := bob.BucketCredentials(ctx, api.BucketRef{StackID: sid, Label: "keep"})
	if err != nil || shareKey.Access != "read" {
		t.Fatalf("bob's credentials from a share: %+v %v", shareKey, err)
	}
	if got, err := s3client.Get(ctx, s3As(shareKey), keep.Bucket, "kept.txt"); err != nil || got != "still here" {
		t.Fatalf("bob reads through his share: %q %v", got, err)
	}
	if err := s3client.Put(ctx, s3As(shareKey), keep.Bucket, "b.txt", "from bob"); s3client.HTTPStatus(err) != 403 {
		t.Fatalf("bob writes through a readonly share: %v (want 403)", err)
	}
	if _, err := c.MachineUnshare(ctx, api.ShareParams{MachineID: vm.ID, Username: "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s3client.Get(ctx, s3As(shareKey), keep.Bucket, "kept.txt"); s3client.HTTPStatus(err) != 403 {
		t.Fatalf("bob's key after unshare: %v (want 403)", err)
	}
	if _, err := bob.BucketCredentials(ctx, api.BucketRef{StackID: sid, Label: "keep"}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("bob's credentials after unshare: %v", err)
	}

	// bob may not end the claim; alice does (its data too); the next build claims it again, empty.
	cacheRef := api.BucketRef{StackID: sid, Label: "cache"}
	if _, err := bob.BucketDelete(ctx, api.BucketDeleteParams{BucketRef: cacheRef}); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("bob's bucket.delete: %v", err)
	}
	if v, err := c.BucketDelete(ctx, api.BucketDeleteParams{BucketRef: cacheRef}); err != nil || v.State != "deleted" || v.Retain || v.Bucket != cache.Bucket {
		t.Fatalf("bucket.delete: %+v %v", v, err)
	}
	if l, err := c.BucketList(ctx, api.BucketListParams{StackID: sid}); err != nil || len(l.Buckets) != 2 {
		t.Fatalf("bucket.list after bucket.delete: %+v %v", l, err)
	}
	if _, err := c.BucketCredentials(ctx, cacheRef); !errors.Is(err, kite.ErrNotFound) {
		t.Fatalf("credentials of a deleted claim: %v", err)
	}
	apply(false)
	if _, err := s3client.Get(ctx, s3As(ownerKey), cache.Bucket, "a.txt"); s3client.HTTPStatus(err) != 404 {
		t.Fatalf("the bucket claimed again: %v (want 404: a new, empty bucket)", err)
	}

	// An update whose template no longer declares cache ends its claim (deleted: no retain).
	if _, err := c.TemplateUpdate(ctx, api.TemplateParams{TemplateID: tid, Files: map[string]string{"main.tf": strings.Replace(bucketTemplate,
		"resource \"kloud_bucket\" \"cache\" {\n  retain = false\n}\n", "", 1)}}); err != nil {
		t.Fatal(err)
	}
	up, err := c.StackUpdate(ctx, api.StackUpdateParams{StackID: sid})
	if err != nil {
		t.Fatal(err)
	}
	if last := f.follow(up.JobID); last.Status != "succeeded" {
		t.Fatalf("update: %+v", last)
	}
	if l, err := c.BucketList(ctx, api.BucketListParams{StackID: sid}); err != nil || len(l.Buckets) != 2 || slices.ContainsFunc(l.Buckets, func(b api.BucketView) bool { return b.Label == "cache" }) {
		t.Fatalf("bucket.list after an update without cache: %+v %v", l, err)
	}
	if _, err := prov.Grant(ctx, cache.Bucket, "carol", provider.BucketRead); !errors.Is(err, provider.ErrBucketNotFound) {
		t.Fatalf("grant on the bucket the update ended: %v (want ErrBucketNotFound)", err)
	}

	// kloud gc removes a bucket of this kloud that no claim holds, and only that one.
	orphan := model.BucketName(sid, "orphan")
	if _, _, err := prov.Provision(ctx, provider.BucketClaim{Name: orphan, Owner: "alice",
		Tags: provider.ResourceTags(sid, model.DefaultTeam, "alice", "", "")}); err != nil {
		t.Fatal(err)
	}
	admin := f.Client(kloud.Admin)
	for _, dry := range []bool{true, false} {
		gc, err := admin.GCRun(ctx, api.GCRunParams{DryRun: dry, Provider: "dummy"})
		if err != nil || len(gc.Garbage) != 1 || gc.Garbage[0].Resource.ID != orphan || gc.Garbage[0].Removed == dry || gc.Garbage[0].Error != "" {
			t.Fatalf("gc.run (dry run %v): %+v %v", dry, gc, err)
		}
	}
	if _, err := prov.Grant(ctx, orphan, "carol", provider.BucketRead); !errors.Is(err, provider.ErrBucketNotFound) {
		t.Fatalf("grant on the bucket gc removed: %v (want ErrBucketNotFound)", err)
	}
	if bs, err := prov.Buckets(ctx); err != nil || len(bs) != 2 {
		t.Fatalf("the claimed buckets after gc: %+v %v", bs, err)
	}

	// A kloud that died after recording a claim and before provisioning it: destroy ends it.
	ghost := model.BucketClaim{ID: model.BucketClaimID(sid, "ghost"), StackID: sid, Label: "ghost", Bucket: model.BucketName(sid, "ghost"),
		Provider: "dummy", Owner: "alice", Team: model.DefaultTeam}
	if _, err := f.Server.Store().BucketClaims().Ensure(ctx, ghost); err != nil {
		t.Fatal(err)
	}

	// Destroy: cache is gone, keep stays with its data (a new key reads it), no claims left.
	apply(true)
	if list, err := c.BucketList(ctx, api.BucketListParams{}); err != nil || len(list.Buckets) != 0 {
		t.Fatalf("bucket.list after destroy: %+v %v", list, err)
	}
	// The provisioner lists neither: cache is gone, keep is no longer this instance's.
	if bs, err := prov.Buckets(ctx); err != nil || len(bs) != 0 {
		t.Fatalf("the server's buckets after destroy: %+v %v", bs, err)
	}
	if _, err := prov.Grant(ctx, byLabel["scratch"].Bucket, "carol", provider.BucketRead); !errors.Is(err, provider.ErrBucketNotFound) {
		t.Fatalf("grant on the bucket destroy deleted: %v (want ErrBucketNotFound)", err)
	}
	if _, err := s3client.Get(ctx, s3As(keepKey), keep.Bucket, "kept.txt"); s3client.HTTPStatus(err) != 403 {
		t.Fatalf("a retained bucket's old key: %v (want 403)", err)
	}
	k, err := prov.Grant(ctx, keep.Bucket, "carol", provider.BucketRead)
	if err != nil {
		t.Fatal(err)
	}
	carol := api.BucketCredentials{Endpoint: keep.Endpoint, Region: keep.Region, AccessKeyID: k.AccessKey, SecretAccessKey: k.SecretKey}
	if got, err := s3client.Get(ctx, s3As(carol), keep.Bucket, "kept.txt"); err != nil || got != "still here" {
		t.Fatalf("the retained bucket's data: %q %v", got, err)
	}
	if err := prov.Delete(context.WithoutCancel(ctx), keep.Bucket, false); err != nil {
		t.Fatal(err)
	}
}
