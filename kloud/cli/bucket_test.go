package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/kloud/store"
	"github.com/kloud-dev/kloud/objstore/seaweed/seaweedtest"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/dummy"
)

// TestBucketCommands: kloud bucket list shows a stack's claim (never a key), credentials prints
// the owner's own key as export lines, grant and revoke change the claim's grants, another user
// sees nothing, delete --retain ends the claim. The claim is a real bucket on SeaweedFS (the
// build that makes claims is kloud's TestBucketClaims).
func TestBucketCommands(t *testing.T) {
	t.Parallel()
	srv := seaweedtest.Start(t)
	prov := srv.Provisioner("cli-" + strings.ToLower(t.Name()))
	reg := provider.NewRegistry()
	p := dummy.New(dummy.Options{Dir: filepath.Join(t.TempDir(), "machines")})
	p.Buckets = prov
	reg.Register(p)
	e, run, must := startKloud(t, kloudtest.Options{Providers: reg})
	aliceKey, bobKey := filepath.Join(t.TempDir(), "alice.key"), filepath.Join(t.TempDir(), "bob.key")
	for _, u := range []struct{ name, key string }{{"alice", aliceKey}, {"bob", bobKey}} {
		must(run("user", "add", u.name, "--team", model.DefaultTeam))
		must(run("key", "create", "--username", u.name, "--out", u.key))
	}
	ctx, s := t.Context(), e.Server.Store()
	now := s.Now()
	st := model.Stack{ID: store.NewID(), Title: "with a bucket", Team: model.DefaultTeam, Owner: "alice", State: model.StackInitialized, CreatedAt: now, UpdatedAt: now}
	if err := s.Stacks().Insert(ctx, st); err != nil {
		t.Fatal(err)
	}
	name := model.BucketName(st.ID, "cache")
	b, key, err := prov.Provision(ctx, provider.BucketClaim{Name: name, Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.BucketClaims().Ensure(ctx, model.BucketClaim{ID: model.BucketClaimID(st.ID, "cache"), StackID: st.ID, Label: "cache", Bucket: name,
		Provider: "dummy", Owner: "alice", Team: model.DefaultTeam, State: model.BucketReady, Endpoint: b.Endpoint, Region: b.Region}); err != nil {
		t.Fatal(err)
	}

	out := must(run("bucket", "list", "--key", aliceKey))
	if !strings.Contains(out, name) || !strings.Contains(out, "ready") || strings.Contains(out, key.SecretKey) || strings.Contains(out, key.AccessKey) {
		t.Fatalf("bucket list:\n%s", out)
	}
	out = must(run("bucket", "credentials", st.ID, "cache", "--key", aliceKey))
	for _, want := range []string{"export KLOUD_BUCKET='" + name + "'", "export AWS_ENDPOINT_URL='" + b.Endpoint + "'",
		"export AWS_ACCESS_KEY_ID='" + key.AccessKey + "'", "export AWS_SECRET_ACCESS_KEY='" + key.SecretKey + "'"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("bucket credentials lacks %s:\n%s", want, out)
		}
	}
	if code, _, stderr := run("bucket", "credentials", st.ID, "cache", "--key", bobKey); code == 0 || !strings.Contains(stderr, "not found") {
		t.Errorf("bob's credentials: exit %d: %s", code, stderr)
	}
	if code, _, stderr := run("bucket", "grant", st.ID, "cache", "bob", "admin", "--key", aliceKey); code == 0 || !strings.Contains(stderr, "bucket access") {
		t.Errorf("grant admin: exit %d: %s", code, stderr)
	}
	out = must(run("bucket", "grant", st.ID, "cache", "bob", "read", "--key", aliceKey))
	if !strings.Contains(out, "bob may read bucket "+name) {
		t.Errorf("bucket grant:\n%s", out)
	}
	var bobs api.BucketCredentials
	if err := json.Unmarshal([]byte(must(run("bucket", "credentials", st.ID, "cache", "--key", bobKey, "--json"))), &bobs); err != nil ||
		bobs.Access != "read" || bobs.AccessKeyID == "" || bobs.AccessKeyID == key.AccessKey {
		t.Fatalf("bob's credentials --json: %+v %v", bobs, err)
	}
	var list api.BucketListResult
	if err := json.Unmarshal([]byte(must(run("bucket", "list", "--key", bobKey, "--json"))), &list); err != nil ||
		len(list.Buckets) != 1 || list.Buckets[0].Grants["bob"] != "read" {
		t.Fatalf("bob's bucket list --json: %+v %v", list, err)
	}
	must(run("bucket", "revoke", st.ID, "cache", "bob", "--key", aliceKey))
	if out := must(run("bucket", "list", "--key", bobKey)); strings.Contains(out, name) {
		t.Errorf("bob still lists the bucket after revoke:\n%s", out)
	}
	if out := must(run("bucket", "list")); !strings.Contains(out, name) {
		t.Errorf("the kloud admin's bucket list lacks alice's bucket:\n%s", out)
	}
	out = must(run("bucket", "delete", st.ID, "cache", "--retain", "--key", aliceKey))
	if !strings.Contains(out, "bucket "+name+" released; its data kept") {
		t.Errorf("bucket delete --retain:\n%s", out)
	}
	if out := must(run("bucket", "list", "--key", aliceKey)); strings.Contains(out, name) {
		t.Errorf("the claim is still listed after delete:\n%s", out)
	}
	if err := prov.Delete(ctx, name, false); err != nil { // the retained bucket: this test's own
		t.Fatal(err)
	}
}
