package e2e

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/objstore/s3client"
	"github.com/kloud-dev/kloud/objstore/seaweed/seaweedtest"
)

// TestLocalBuckets is a stack's bucket claims on local machines, with the S3 server kloud serve
// starts (SeaweedFS; docs/buckets.md): a file one machine writes with the key kloud gave it, the
// other machine reads (curl's SigV4 in the machines, as their owner's login shell finds the
// keys); the owner's key from `kloud bucket credentials` works from the host with an
// independent client (aws-sdk-go-v2); a readonly share gives bob a key that lists and reads, and
// the server itself refuses its writes (403); after unshare the same key gets 403; destroying
// the stack deletes the bucket without retain and keeps the one with retain, data and all.
func TestLocalBuckets(t *testing.T) {
	parallel(t)
	if os.Getenv(seaweedtest.EnvWeed) == "" {
		testutil.Unavailable(t, "$%s (SeaweedFS's weed, built by scripts/setup.sh) is not set: kloud serve starts no S3 server", seaweedtest.EnvWeed)
	}
	e := newLocalEnv(t, "--s3", "auto")
	e.alice()
	tid := e.template(localTemplate("web", 2, "true") + `
resource "kloud_bucket" "data" {}

resource "kloud_bucket" "keep" {
  retain = true
}
`)
	sid := e.createStack(tid)
	out := e.apply(sid)
	for _, secretish := range []string{"SECRET", "secretAccessKey", "AWS_SECRET"} {
		if strings.Contains(out, secretish) {
			t.Errorf("the build's output mentions %s:\n%s", secretish, out)
		}
	}
	ms := e.machines(sid)
	id0, id1 := ms["web.0"].sandboxID(), ms["web.1"].sandboxID()

	// In the machines: alice's login shell has the keys; web.0 writes, web.1 reads.
	sh := func(id, script string) string {
		return e.exec(id, "su", "-", "alice", "-c", script)
	}
	curl := `curl -sS --fail-with-body --aws-sigv4 "aws:amz:$KLOUD_BUCKET_DATA_REGION:s3" ` +
		`--user "$KLOUD_BUCKET_DATA_ACCESS_KEY_ID:$KLOUD_BUCKET_DATA_SECRET_ACCESS_KEY" `
	word := randomWord()
	testutil.Eventually(t, 60*time.Second, func() bool {
		return strings.Contains(sh(id0, `test -n "$KLOUD_BUCKET_DATA_ENDPOINT" && echo ready`), "ready")
	}, "web.0: alice's login shell has no KLOUD_BUCKET_DATA_ENDPOINT")
	sh(id0, `echo `+word+` > /tmp/w && `+curl+`-T /tmp/w "$KLOUD_BUCKET_DATA_ENDPOINT/$KLOUD_BUCKET_DATA_NAME/from-web0.txt"`)
	if got := sh(id1, curl+`"$KLOUD_BUCKET_DATA_ENDPOINT/$KLOUD_BUCKET_DATA_NAME/from-web0.txt"`); strings.TrimSpace(got) != word {
		t.Fatalf("web.1 read %q, web.0 wrote %q", got, word)
	}
	if got := sh(id1, `stat -c %a:%U ~/.config/kloud/buckets/data.env`); got != "600:alice" {
		t.Errorf("data.env: mode and owner %q, want 600:alice", got)
	}

	// From the host, with an independent client: alice's own key.
	creds := func(key string) (c struct {
		Bucket, Endpoint, Region, Access, AccessKeyID, SecretAccessKey string
	}) {
		t.Helper()
		saved := e.key
		e.key = key
		defer func() { e.key = saved }()
		e.runJSON(&c, "bucket", "credentials", sid, "data")
		return c
	}
	alice := creds(e.key)
	if alice.Access != "write" || alice.SecretAccessKey == "" {
		t.Fatalf("alice's credentials: %+v", alice)
	}
	ctx := t.Context()
	ac := s3client.New(alice.Endpoint, alice.Region, alice.AccessKeyID, alice.SecretAccessKey)
	if got := getObject(ctx, t, ac, alice.Bucket, "from-web0.txt"); strings.TrimSpace(got) != word {
		t.Errorf("the host read %q with alice's key, want %q", got, word)
	}
	if out := e.run("bucket", "list", "--stack", sid); strings.Contains(out, alice.SecretAccessKey) || !strings.Contains(out, "data") || !strings.Contains(out, "keep") {
		t.Errorf("bucket list:\n%s", out)
	}

	// bob: a readonly share of web.0 reads and lists, and the server refuses his writes.
	aliceKey := e.key
	e.key = "" // the admin's
	e.run("user", "add", "bob", "--team", "default")
	bobKey := filepath.Join(e.dir, "bob.key")
	e.run("key", "create", "--username", "bob", "--out", bobKey)
	e.key = aliceKey
	e.run("machine", "share", "web.0", "bob", "--grant", "readonly", "--stack", sid)
	bob := creds(bobKey)
	if bob.Access != "read" || bob.AccessKeyID == alice.AccessKeyID {
		t.Fatalf("bob's credentials after a readonly share: %+v", bob)
	}
	bc := s3client.New(bob.Endpoint, bob.Region, bob.AccessKeyID, bob.SecretAccessKey)
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := bc.GetObject(ctx, &s3.GetObjectInput{Bucket: &bob.Bucket, Key: aws.String("from-web0.txt")})
		return err == nil
	}, "bob's read key cannot read")
	if _, err := bc.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &bob.Bucket}); err != nil {
		t.Errorf("bob lists: %v", err)
	}
	if code := s3client.ErrorCode(s3client.Put(ctx, bc, bob.Bucket, "by-bob.txt", "no")); code != "AccessDenied" {
		t.Errorf("bob's write with a read key: %q, want AccessDenied from the server", code)
	}
	e.run("machine", "unshare", "web.0", "bob", "--stack", sid)
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err := bc.GetObject(ctx, &s3.GetObjectInput{Bucket: &bob.Bucket, Key: aws.String("from-web0.txt")})
		return s3client.HTTPStatus(err) == 403
	}, "bob's key still reads after unshare")

	// Destroy: "data" goes, "keep" (retain) stays with its data.
	keepBucket := ""
	var list struct {
		Buckets []struct{ Label, Bucket string }
	}
	e.runJSON(&list, "bucket", "list", "--stack", sid)
	for _, b := range list.Buckets {
		if b.Label == "keep" {
			keepBucket = b.Bucket
		}
	}
	admin := e.s3Admin(alice.Endpoint)
	if err := s3client.Put(ctx, admin, keepBucket, "kept.txt", word); err != nil {
		t.Fatalf("admin write to %s: %v", keepBucket, err)
	}
	e.run("stack", "destroy", sid)
	if _, err := admin.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &alice.Bucket}); s3client.HTTPStatus(err) != 404 {
		t.Errorf("bucket %s after destroy: %v, want 404", alice.Bucket, err)
	}
	if got := getObject(ctx, t, admin, keepBucket, "kept.txt"); got != word {
		t.Errorf("retained bucket %s after destroy: kept.txt = %q, want %q", keepBucket, got, word)
	}
	if _, err := ac.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &alice.Bucket}); err == nil {
		t.Errorf("alice's key still lists %s after destroy", alice.Bucket)
	}
}

// s3Admin is a client of kloud's S3 server with its admin key (kept in the data dir).
func (e *localEnv) s3Admin(endpoint string) *s3.Client {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.dir, "s3", "admin.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	var k struct{ AccessKey, SecretKey string }
	if err := json.Unmarshal(b, &k); err != nil {
		e.t.Fatal(err)
	}
	return s3client.New(endpoint, "", k.AccessKey, k.SecretKey)
}

func getObject(ctx context.Context, t *testing.T, c *s3.Client, bucket, key string) string {
	t.Helper()
	o, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		t.Errorf("get %s/%s: %v", bucket, key, err)
		return ""
	}
	defer o.Body.Close()
	b, _ := io.ReadAll(o.Body)
	return string(b)
}

// TestBrowserBuckets is a stack's bucket in the web UI (e2e/browser/buckets.mjs) on a local
// machine with kloud serve's S3 server: alice opens her stack's page, sees the bucket with no key
// in the page, opens "Show my key" and reads the key `kloud bucket credentials --json` gives her,
// grants bob read and revokes it, finds the claim on the Buckets page, and deletes the bucket
// (the server has it no more). Screenshots in
// $KLOUD_ARTIFACTS/TestBrowserBuckets.
func TestBrowserBuckets(t *testing.T) {
	node, script, out := browserPrereqs(t)
	if os.Getenv(seaweedtest.EnvWeed) == "" {
		testutil.Unavailable(t, "$%s (SeaweedFS's weed, built by scripts/setup.sh) is not set: kloud serve starts no S3 server", seaweedtest.EnvWeed)
	}
	e := newLocalEnv(t, "--s3", "auto")
	password := browserUsers(t, e.env)
	aliceKey := filepath.Join(e.dir, "alice.key")
	e.run("key", "create", "--username", "alice", "--out", aliceKey)
	e.key = aliceKey
	sid := e.createStack(e.template(localTemplate("dev", 1, "true") + "\nresource \"kloud_bucket\" \"data\" {}\n"))
	e.apply(sid)
	var creds struct {
		Bucket          string `json:"bucket"`
		Endpoint        string `json:"endpoint"`
		AccessKeyID     string `json:"accessKeyId"`
		SecretAccessKey string `json:"secretAccessKey"`
	}
	e.runJSON(&creds, "bucket", "credentials", sid, "data")
	credsJSON, _ := json.Marshal(creds)
	runBrowserScript(t, e.env, node, script, out, "buckets.mjs", nil, "KLOUD_PASSWORD="+password,
		"KLOUD_STACK="+sid, "KLOUD_BUCKET=data", "KLOUD_CREDS="+string(credsJSON), "KLOUD_GRANT_USER=bob")
	if out := e.run("bucket", "list", "--stack", sid); strings.Contains(out, creds.Bucket) {
		t.Errorf("the browser deleted the bucket, and bucket list still shows it:\n%s", out)
	}
	if code := s3client.HTTPStatus(headBucket(t.Context(), e.s3Admin(creds.Endpoint), creds.Bucket)); code != 404 {
		t.Errorf("bucket %s after the browser deleted it: status %d, want 404", creds.Bucket, code)
	}
	e.run("stack", "destroy", sid)
}

func headBucket(ctx context.Context, c *s3.Client, bucket string) error {
	_, err := c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &bucket})
	return err
}
