package klient_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient"
	"github.com/kloud-dev/kloud/klient/klientapi"
)

// klient.setBuckets writes the owner's bucket files (0600, the owner's) and the profile script;
// a login shell's environment then has the variables (with one bucket, the AWS_* ones too); a
// new list replaces the old one; bad params are refused before anything is written.
func TestSetBuckets(t *testing.T) {
	e := newEnv(t)
	cache := klientapi.BucketEnv{Label: "build-cache", Bucket: "k-s1-build-cache", Endpoint: "http://10.200.0.1:8333", Region: "us-east-1",
		AccessKeyID: "AKCACHE", SecretAccessKey: "secret/cache+1"}
	data := klientapi.BucketEnv{Label: "data", Bucket: "k-s1-data", Endpoint: "http://10.200.0.1:8333", Region: "us-east-1",
		AccessKeyID: "AKDATA", SecretAccessKey: "secret-data"}
	var res klientapi.SetBucketsResult
	if err := e.call(klientapi.MethodSetBuckets, klientapi.SetBucketsParams{Buckets: []klientapi.BucketEnv{cache}}, &res); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.mach.Home, klient.BucketsDir)
	profile := filepath.Join(e.mach.Root, klient.BucketsProfile)
	if len(res.Files) != 2 || res.Files[0] != filepath.Join(dir, "build-cache.env") || res.Files[1] != profile {
		t.Fatalf("files: %v", res.Files)
	}
	fi, err := os.Stat(res.Files[0])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || int(fi.Sys().(*syscall.Stat_t).Uid) != e.mach.UID {
		t.Fatalf("%s: mode %v uid %d, want 0600 and uid %d", res.Files[0], fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, e.mach.UID)
	}
	env := func() string {
		t.Helper()
		out, err := exec.Command("sh", "-c", `HOME="$1"; . "$2"; env`, "sh", e.mach.Home, profile).CombinedOutput()
		if err != nil {
			t.Fatalf("source the profile script: %v\n%s", err, out)
		}
		return string(out)
	}
	got := env()
	for _, want := range []string{"KLOUD_BUCKET_BUILD_CACHE_NAME=k-s1-build-cache", "KLOUD_BUCKET_BUILD_CACHE_ENDPOINT=http://10.200.0.1:8333",
		"KLOUD_BUCKET_BUILD_CACHE_REGION=us-east-1", "KLOUD_BUCKET_BUILD_CACHE_ACCESS_KEY_ID=AKCACHE",
		"KLOUD_BUCKET_BUILD_CACHE_SECRET_ACCESS_KEY=secret/cache+1", "AWS_ENDPOINT_URL=http://10.200.0.1:8333", "AWS_ACCESS_KEY_ID=AKCACHE",
		"AWS_SECRET_ACCESS_KEY=secret/cache+1", "AWS_REGION=us-east-1"} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("a login shell's environment lacks %s:\n%s", want, got)
		}
	}

	// Two buckets: no AWS_* (which would it be?); a list without build-cache removes its file.
	if err := e.call(klientapi.MethodSetBuckets, klientapi.SetBucketsParams{Buckets: []klientapi.BucketEnv{cache, data}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := env(); strings.Contains(got, "AWS_ACCESS_KEY_ID") || !strings.Contains(got, "KLOUD_BUCKET_DATA_NAME=k-s1-data\n") {
		t.Fatalf("two buckets:\n%s", got)
	}
	if err := e.call(klientapi.MethodSetBuckets, klientapi.SetBucketsParams{Buckets: []klientapi.BucketEnv{data}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "build-cache.env")); !os.IsNotExist(err) {
		t.Fatalf("the file of a bucket no longer listed: %v", err)
	}

	for _, bad := range []klientapi.BucketEnv{
		{Label: "Data", Bucket: "b", Endpoint: "e", Region: "r", AccessKeyID: "a", SecretAccessKey: "s"},
		{Label: "data", Bucket: "b'; rm -rf /", Endpoint: "e", Region: "r", AccessKeyID: "a", SecretAccessKey: "s"},
		{Label: "data", Bucket: "b", Endpoint: "e", Region: "r", AccessKeyID: "a", SecretAccessKey: "s\nexport X=1"},
		{Label: "data", Bucket: "b", Endpoint: "e", Region: "r", AccessKeyID: "a"},
	} {
		if err := e.call(klientapi.MethodSetBuckets, klientapi.SetBucketsParams{Buckets: []klientapi.BucketEnv{bad}}, nil); !errors.Is(err, kite.ErrInvalidParams) {
			t.Errorf("%+v: %v, want invalid params", bad, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "data.env")); err != nil || !strings.Contains(string(b), "secret-data") {
		t.Fatalf("a refused call changed the files: %q %v", b, err)
	}
}
