package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kloud-dev/kloud/provider"
)

// recordingBuckets is a provider.BucketProvisioner that keeps its buckets and keys in memory and
// records every call it gets, for a test of the wire (what kloud sends arrives unchanged, what
// the plugin answers comes back unchanged). The real provisioner's test is
// bucket_seaweed_test.go.
type recordingBuckets struct {
	mu      sync.Mutex
	calls   []string
	buckets map[string]provider.Bucket
	keys    map[string]provider.BucketKey // bucket/user →
	claims  map[string]provider.BucketClaim
	fail    error // returned by every call while set
}

func newRecordingBuckets() *recordingBuckets {
	return &recordingBuckets{buckets: map[string]provider.Bucket{}, keys: map[string]provider.BucketKey{}, claims: map[string]provider.BucketClaim{}}
}

func (r *recordingBuckets) record(f string, args ...any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf(f, args...))
	return r.fail
}

func (r *recordingBuckets) key(bucket, user string, access provider.BucketAccess) provider.BucketKey {
	k, ok := r.keys[bucket+"/"+user]
	if !ok {
		k = provider.BucketKey{User: user, AccessKey: "AK" + strings.ToUpper(user) + fmt.Sprint(len(r.keys)), SecretKey: "secret/" + bucket + "/" + user + "+="}
	}
	k.Access = access
	r.keys[bucket+"/"+user] = k
	return k
}

func (r *recordingBuckets) Provision(_ context.Context, c provider.BucketClaim) (provider.Bucket, provider.BucketKey, error) {
	if err := r.record("provision %s owner=%s maxBytes=%d tags=%v", c.Name, c.Owner, c.MaxBytes, c.Tags); err != nil {
		return provider.Bucket{}, provider.BucketKey{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.buckets[c.Name]
	if !ok {
		b = provider.Bucket{Name: c.Name, Endpoint: "http://10.200.0.1:8333", Region: "us-east-1", Tags: c.Tags}
		r.buckets[c.Name] = b
		r.claims[c.Name] = c
	}
	return b, r.key(c.Name, c.Owner, provider.BucketWrite), nil
}

func (r *recordingBuckets) Grant(_ context.Context, bucket, user string, access provider.BucketAccess) (provider.BucketKey, error) {
	if err := r.record("grant %s %s %s", bucket, user, access); err != nil {
		return provider.BucketKey{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.buckets[bucket]; !ok {
		return provider.BucketKey{}, fmt.Errorf("grant %s to %s: %w", bucket, user, provider.ErrBucketNotFound)
	}
	return r.key(bucket, user, access), nil
}

func (r *recordingBuckets) Revoke(_ context.Context, bucket, user string) error {
	if err := r.record("revoke %s %s", bucket, user); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.keys, bucket+"/"+user)
	return nil
}

func (r *recordingBuckets) Delete(_ context.Context, bucket string, retain bool) error {
	if err := r.record("delete %s retain=%v", bucket, retain); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.buckets, bucket)
	for k := range r.keys {
		if strings.HasPrefix(k, bucket+"/") {
			delete(r.keys, k)
		}
	}
	return nil
}

func (r *recordingBuckets) Buckets(context.Context) ([]provider.Bucket, error) {
	if err := r.record("list"); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.SortedFunc(maps.Values(r.buckets), func(a, b provider.Bucket) int { return strings.Compare(a.Name, b.Name) }), nil
}

func (r *recordingBuckets) took() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

// TestBucketWire: a plugin whose Provider has Buckets advertises "bucket"; kloud's proxy of it
// has a Buckets whose five calls reach the plugin's provisioner with their params unchanged and
// bring its results back unchanged; provider.ErrBucketNotFound and provider.ErrUnsupported
// survive the wire; the plugin refuses invalid params before its provisioner sees them; a plugin
// without Buckets does not advertise the capability and its proxy has none.
func TestBucketWire(t *testing.T) {
	e := startKloud(t)
	rb := newRecordingBuckets()
	p := filesProvider("files", newSeen("a"), noUnavailable())
	p.Buckets = rb
	e.run(p, e.pluginKey("files"))
	e.run(filesProvider("plain", newSeen("b"), noUnavailable()), e.pluginKey("plain"))
	e.wait("files")
	e.wait("plain")
	ctx := t.Context()

	px, err := e.reg.Lookup("files")
	if err != nil {
		t.Fatal(err)
	}
	if !px.Can(provider.CapBucket) || px.Buckets == nil {
		t.Fatalf("proxy of a plugin with Buckets: capabilities %v, buckets %v", px.Caps(), px.Buckets)
	}
	bp := px.Buckets

	claim := provider.BucketClaim{Name: "kloud-s1-cache", Owner: "alice", MaxBytes: 1 << 30,
		Tags: provider.ResourceTags("s1", "t", "alice", "", "i1")}
	b, key, err := bp.Provision(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	want := provider.Bucket{Name: claim.Name, Endpoint: "http://10.200.0.1:8333", Region: "us-east-1", Tags: claim.Tags}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("Provision: bucket %+v, want %+v", b, want)
	}
	if key.User != "alice" || key.Access != provider.BucketWrite || key.AccessKey == "" || key.SecretKey != "secret/kloud-s1-cache/alice+=" {
		t.Errorf("Provision: key %+v", key)
	}
	if got := rb.claims[claim.Name]; !reflect.DeepEqual(got, claim) {
		t.Errorf("the plugin got claim %+v, kloud sent %+v", got, claim)
	}
	// Twice: the same bucket and key (the provisioner's idempotency, unchanged by the wire).
	b2, key2, err := bp.Provision(ctx, claim)
	if err != nil || !reflect.DeepEqual(b2, b) || key2 != key {
		t.Errorf("Provision again: %+v %+v %v, want the first answer", b2, key2, err)
	}

	bob, err := bp.Grant(ctx, claim.Name, "bob", provider.BucketRead)
	if err != nil || bob.User != "bob" || bob.Access != provider.BucketRead || bob.AccessKey == "" || bob.AccessKey == key.AccessKey {
		t.Errorf("Grant read: %+v %v", bob, err)
	}
	bobW, err := bp.Grant(ctx, claim.Name, "bob", provider.BucketWrite)
	if err != nil || bobW.Access != provider.BucketWrite || bobW.AccessKey != bob.AccessKey {
		t.Errorf("Grant write to a user with a key: %+v %v, want the same key with write", bobW, err)
	}
	_, err = bp.Grant(ctx, "no-such-bucket", "bob", provider.BucketRead)
	if !errors.Is(err, provider.ErrBucketNotFound) || !strings.Contains(err.Error(), "grant no-such-bucket to bob") {
		t.Errorf("Grant of a missing bucket: %v, want the plugin's message wrapping ErrBucketNotFound", err)
	}
	if errors.Is(err, provider.ErrUnsupported) {
		t.Errorf("Grant of a missing bucket: %v is ErrUnsupported", err)
	}
	for range 2 {
		if err := bp.Revoke(ctx, claim.Name, "bob"); err != nil {
			t.Errorf("Revoke: %v", err)
		}
	}
	bs, err := bp.Buckets(ctx)
	if err != nil || len(bs) != 1 || !reflect.DeepEqual(bs[0], want) {
		t.Errorf("Buckets: %+v %v, want [%+v]", bs, err, want)
	}
	if err := bp.Delete(ctx, claim.Name, true); err != nil {
		t.Errorf("Delete retain: %v", err)
	}
	if err := bp.Delete(ctx, claim.Name, false); err != nil {
		t.Errorf("Delete: %v", err)
	}
	if bs, err := bp.Buckets(ctx); err != nil || bs == nil || len(bs) != 0 {
		t.Errorf("Buckets after Delete: %#v %v, want an empty list", bs, err)
	}
	wantCalls := []string{
		"provision kloud-s1-cache owner=alice maxBytes=1073741824 tags=" + fmt.Sprint(claim.Tags),
		"provision kloud-s1-cache owner=alice maxBytes=1073741824 tags=" + fmt.Sprint(claim.Tags),
		"grant kloud-s1-cache bob read", "grant kloud-s1-cache bob write", "grant no-such-bucket bob read",
		"revoke kloud-s1-cache bob", "revoke kloud-s1-cache bob", "list",
		"delete kloud-s1-cache retain=true", "delete kloud-s1-cache retain=false", "list",
	}
	if got := rb.took(); !slices.Equal(got, wantCalls) {
		t.Errorf("the plugin's provisioner got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantCalls, "\n"))
	}

	// The plugin's own errors come back with their message; ErrUnsupported stays recognizable.
	rb.fail = errors.New("the S3 server says: SlowDown")
	if _, _, err := bp.Provision(ctx, claim); err == nil || err.Error() != "the S3 server says: SlowDown" {
		t.Errorf("Provision failing: %v, want the plugin's error", err)
	}
	rb.fail = fmt.Errorf("delete with retain: %w", provider.ErrUnsupported)
	if err := bp.Delete(ctx, claim.Name, true); !errors.Is(err, provider.ErrUnsupported) || !strings.Contains(err.Error(), "delete with retain") {
		t.Errorf("Delete failing with ErrUnsupported: %v", err)
	}
	rb.fail = nil
	rb.took()

	// Invalid params: refused by the plugin's side; its provisioner never sees them.
	long := strings.Repeat("u", 129)
	for name, call := range map[string]func() error{
		"provision bad name": func() error {
			_, _, err := bp.Provision(ctx, provider.BucketClaim{Name: "Bad_Name", Owner: "alice"})
			return err
		},
		"provision IP name": func() error {
			_, _, err := bp.Provision(ctx, provider.BucketClaim{Name: "10.0.0.1", Owner: "alice"})
			return err
		},
		"provision no owner": func() error { _, _, err := bp.Provision(ctx, provider.BucketClaim{Name: "good-name"}); return err },
		"provision negative": func() error {
			_, _, err := bp.Provision(ctx, provider.BucketClaim{Name: "good-name", Owner: "a", MaxBytes: -1})
			return err
		},
		"provision empty tag": func() error {
			_, _, err := bp.Provision(ctx, provider.BucketClaim{Name: "good-name", Owner: "a", Tags: map[string]string{"": "x"}})
			return err
		},
		"grant bad access":      func() error { _, err := bp.Grant(ctx, "good-name", "bob", "admin"); return err },
		"grant no user":         func() error { _, err := bp.Grant(ctx, "good-name", "", provider.BucketRead); return err },
		"grant long user":       func() error { _, err := bp.Grant(ctx, "good-name", long, provider.BucketRead); return err },
		"grant user with space": func() error { _, err := bp.Grant(ctx, "good-name", "bob smith", provider.BucketRead); return err },
		"grant short name":      func() error { _, err := bp.Grant(ctx, "ab", "bob", provider.BucketRead); return err },
		"revoke no user":        func() error { return bp.Revoke(ctx, "good-name", "") },
		"revoke bad name":       func() error { return bp.Revoke(ctx, "a..b", "bob") },
		"delete bad name":       func() error { return bp.Delete(ctx, "-bad", false) },
	} {
		if err := call(); err == nil || errors.Is(err, provider.ErrBucketNotFound) || !strings.Contains(err.Error(), "invalid field") {
			t.Errorf("%s: %v, want a refusal saying what is wrong", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if got := rb.took(); len(got) != 0 {
		t.Errorf("the provisioner got invalid calls: %v", got)
	}

	plain, err := e.reg.Lookup("plain")
	if err != nil {
		t.Fatal(err)
	}
	if plain.Can(provider.CapBucket) || plain.Buckets != nil {
		t.Errorf("proxy of a plugin without Buckets: capabilities %v", plain.Caps())
	}

	// A plugin that advertises "bucket" (Provider.Capabilities) without Buckets answers
	// ErrUnsupported.
	liar := filesProvider("liar", newSeen("c"), noUnavailable())
	liar.Capabilities = append(liar.Caps(), provider.CapBucket)
	e.run(liar, e.pluginKey("liar"))
	e.wait("liar")
	lp, err := e.reg.Lookup("liar")
	if err != nil || lp.Buckets == nil {
		t.Fatalf("proxy of a plugin advertising bucket: %v", err)
	}
	if _, err := lp.Buckets.Buckets(ctx); !errors.Is(err, provider.ErrUnsupported) {
		t.Errorf("Buckets of a plugin without them: %v, want ErrUnsupported", err)
	}
	if _, err := lp.Buckets.Grant(ctx, "good-name", "bob", provider.BucketRead); !errors.Is(err, provider.ErrUnsupported) {
		t.Errorf("Grant of a plugin without Buckets: %v, want ErrUnsupported", err)
	}
}
