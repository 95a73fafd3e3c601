package example_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/examples/provider-example/example"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/objstore/bucketcheck"
	"github.com/kloud-dev/kloud/objstore/seaweed"
	"github.com/kloud-dev/kloud/objstore/seaweed/seaweedtest"
	"github.com/kloud-dev/kloud/provider"
)

// TestBucketConfig: the S3 configuration comes from s3.json in the state directory, else from
// the environment, else there is none and the provider does not advertise "bucket"; an
// incomplete one is an error naming what is missing, never showing the secret.
func TestBucketConfig(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	dir := t.TempDir()

	if c, err := example.LoadS3(dir, getenv); c != nil || err != nil {
		t.Errorf("LoadS3 of nothing: %+v %v, want nil, nil", c, err)
	}
	p := example.New(example.Options{Dir: dir})
	if p.Can(provider.CapBucket) || p.Buckets != nil {
		t.Errorf("the example without S3 advertises %v", p.Caps())
	}

	env[example.EnvS3URL] = "http://127.0.0.1:8333"
	env[example.EnvS3SecretKey] = "s3cr3t-value"
	if _, err := example.LoadS3(dir, getenv); err == nil || !strings.Contains(err.Error(), "master") || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("LoadS3 of an environment without master: %v", err)
	}
	env[example.EnvS3Master] = "127.0.0.1:9333.19333"
	env[example.EnvWeed] = "/usr/local/bin/weed"
	if _, err := example.LoadS3(dir, getenv); err == nil || !strings.Contains(err.Error(), "accessKey") || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("LoadS3 of an environment without the access key: %v", err)
	}
	env[example.EnvS3AccessKey] = "admin"
	c, err := example.LoadS3(dir, getenv)
	want := example.S3{URL: "http://127.0.0.1:8333", Master: "127.0.0.1:9333.19333", Weed: "/usr/local/bin/weed", AccessKey: "admin", SecretKey: "s3cr3t-value"}
	if err != nil || c == nil || *c != want {
		t.Fatalf("LoadS3 of the environment: %+v %v, want %+v", c, err, want)
	}
	p = example.New(example.Options{Dir: dir, S3: c})
	if !p.Can(provider.CapBucket) || p.Buckets == nil {
		t.Errorf("the example with S3 does not advertise %q: %v", provider.CapBucket, p.Caps())
	}

	// The state directory's file wins over the environment.
	file := example.S3{URL: "https://s3.example.com", PublicURL: "http://10.200.0.1:8333", Region: "eu-1", Master: "10.0.0.1:9333",
		Weed: "/state/weed", AccessKey: "ak", SecretKey: "sk"}
	b, _ := json.Marshal(file)
	if err := os.WriteFile(filepath.Join(dir, example.S3File), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := example.LoadS3(dir, getenv); err != nil || c == nil || *c != file {
		t.Errorf("LoadS3 with %s: %+v %v, want %+v", example.S3File, c, err, file)
	}
	for name, bad := range map[string]string{
		"not JSON":      `{"url":`,
		"ftp URL":       `{"url":"ftp://x","master":"a:1","weed":"w","accessKey":"a","secretKey":"s"}`,
		"no weed":       `{"url":"http://x","master":"a:1","accessKey":"a","secretKey":"s"}`,
		"bad publicUrl": `{"url":"http://x","publicUrl":"x","master":"a:1","weed":"w","accessKey":"a","secretKey":"s"}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, example.S3File), []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if c, err := example.LoadS3(dir, getenv); err == nil || !strings.Contains(err.Error(), example.S3File) {
			t.Errorf("LoadS3 of %s: %+v %v, want an error naming the file", name, c, err)
		}
	}
}

// TestBucketS3: the example configured with a real SeaweedFS server (as its plugin's main
// configures it from s3.json) passes the bucket contract (objstore/bucketcheck).
func TestBucketS3(t *testing.T) {
	srv := seaweedtest.Start(t)
	dir := t.TempDir()
	c := s3Config(t, srv, dir)
	p := example.New(example.Options{Dir: dir, S3: c, Logger: testutil.Logger(t)})
	if !p.Can(provider.CapBucket) {
		t.Fatalf("capabilities %v", p.Caps())
	}
	bucketcheck.Run(t, p.Buckets, "ex-"+randomHex(3))
}

// s3Config returns the example's S3 configuration for srv (seaweedtest's), its weed binary
// linked (or copied) into dir, where a sandboxed plugin whose state directory dir is can run it.
func s3Config(t *testing.T, srv *seaweed.Server, dir string) *example.S3 {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	weed := filepath.Join(dir, "weed")
	if err := linkOrCopy(os.Getenv(seaweedtest.EnvWeed), weed); err != nil {
		t.Fatal(err)
	}
	ak, sk := srv.AdminKey()
	return &example.S3{URL: srv.Endpoint(), Master: srv.Master(), Weed: weed, AccessKey: ak, SecretKey: sk}
}

// writeS3File writes c as the plugin's S3File in its state directory, readable by the plugin's
// unprivileged user (the directory itself is the plugin's, 0700).
func writeS3File(t *testing.T, state string, c *example.S3) {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, example.S3File), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// linkOrCopy makes dst the file src (a hard link; a copy across file systems).
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
