package seaweed

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/kloud-dev/kloud/objstore/s3client"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/ptype"
)

// ProvisionerOptions configure NewProvisioner.
type ProvisionerOptions struct {
	// Endpoint is the S3 URL the provisioner calls with the admin key (required).
	Endpoint string
	// PublicEndpoint is the S3 URL in the buckets it returns, the one clients use (default
	// Endpoint).
	PublicEndpoint string
	// Region is the region to sign for (default "us-east-1").
	Region string
	// Master is the SeaweedFS master as weed shell takes it, host:port.grpcPort (required).
	Master string
	// Filer, if set, is the filer as weed shell takes it (host:port.grpcPort): weed shell then
	// need not find it through the master, which takes seconds after the master's start.
	Filer string
	// Weed is the weed binary that runs `weed shell` (required).
	Weed string
	// AdminAccessKey and AdminSecretKey are an identity with the Admin action (required). The
	// secret also derives every user's key (see Grant).
	AdminAccessKey, AdminSecretKey string
	// Instance is the kloud instance: buckets are tagged provider.TagInstance=Instance and
	// Buckets lists those.
	Instance string
	Log      *slog.Logger // nil: discarded
	// ShellDir, if set, is weed shell's working, temporary and home directory.
	ShellDir string
	// Netns, if set, returns the network namespace weed shell must run in (a Server's with
	// Options.Isolate: Server.Netns); "" runs it in kloud's.
	Netns func() string
}

// Provisioner implements provider.BucketProvisioner on SeaweedFS. Buckets are made, tagged and
// deleted with the S3 API and the admin key; every (bucket, user) pair is an identity of its
// own, named "kb_<bucket>_<user>" (a bucket name has no "_"), whose actions are Read:<bucket>
// and List:<bucket>, plus Write:<bucket> and Tagging:<bucket> for write access, set and removed
// with weed shell's s3.configure (the S3 gateway applies it within seconds).
//
// A user's key is derived, not stored: HMAC-SHA256 of (bucket, user) keyed with the admin
// secret. So every call, repeated or after a crash, hands out the same key for the same pair
// and the provisioner keeps no state of its own. The provisioner serializes its calls, with
// those of every other provisioner of the same Server: s3.configure reads an identity, changes
// it and writes it back, and Grant reads the configuration before it changes it.
type Provisioner struct {
	o  ProvisionerOptions
	s3 *s3.Client
	mu *sync.Mutex
}

var _ provider.BucketProvisioner = (*Provisioner)(nil)

// NewProvisioner returns a provisioner of the SeaweedFS at o.Endpoint and o.Master.
func NewProvisioner(o ProvisionerOptions) (*Provisioner, error) {
	if o.Endpoint == "" || o.Master == "" || o.Weed == "" || o.AdminAccessKey == "" || o.AdminSecretKey == "" {
		return nil, errors.New("seaweed provisioner: Endpoint, Master, Weed, AdminAccessKey and AdminSecretKey are required")
	}
	if o.PublicEndpoint == "" {
		o.PublicEndpoint = o.Endpoint
	}
	if o.Region == "" {
		o.Region = "us-east-1"
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Provisioner{o: o, s3: s3client.New(o.Endpoint, o.Region, o.AdminAccessKey, o.AdminSecretKey), mu: new(sync.Mutex)}, nil
}

// TagRetained marks a bucket Delete kept (retain): it no longer carries TagInstance, so
// Buckets (and kloud gc) leave it alone; a later Provision of its name adopts it again.
const TagRetained = "kloud.retained"

var (
	userRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	tagRE  = regexp.MustCompile(`^[\pL\pN +\-=._:/@]*$`)
)

// ValidUser checks a user name: 1 to 64 letters, digits, '.', '_' and '-', beginning
// with a letter or digit.
func ValidUser(user string) error {
	if !userRE.MatchString(user) {
		return fmt.Errorf("bucket user %q: want 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit", user)
	}
	return nil
}

// identity is the SeaweedFS identity of user's key to bucket.
func identity(bucket, user string) string { return "kb_" + bucket + "_" + user }

// identityPrefix is what every identity of bucket's names begin with.
func identityPrefix(bucket string) string { return "kb_" + bucket + "_" }

// actions are the identity actions of an access, sorted.
func actions(bucket string, a ptype.BucketAccess) []string {
	acts := []string{"List:" + bucket, "Read:" + bucket}
	if a == ptype.BucketWrite {
		acts = append(acts, "Tagging:"+bucket, "Write:"+bucket)
	}
	return acts
}

// key derives user's key to bucket: 20 upper-case characters and 40 of base64.
func (p *Provisioner) key(bucket, user string, a ptype.BucketAccess) ptype.BucketKey {
	sum := func(what string) []byte {
		m := hmac.New(sha256.New, []byte(p.o.AdminSecretKey))
		m.Write([]byte("kloud bucket key\x00" + what + "\x00" + bucket + "\x00" + user))
		return m.Sum(nil)
	}
	ak := "KB" + base32.StdEncoding.EncodeToString(sum("access"))[:18]
	sk := base64.RawStdEncoding.EncodeToString(sum("secret"))[:40]
	return ptype.BucketKey{User: user, Access: a, AccessKey: ak, SecretKey: sk}
}

func (p *Provisioner) bucket(name string, tags map[string]string) ptype.Bucket {
	return ptype.Bucket{Name: name, Endpoint: p.o.PublicEndpoint, Region: p.o.Region, Tags: tags}
}

// Provision makes claim's bucket (or finds it), tags it, sets its quota and gives the owner
// write access. A bucket of another kloud instance (its TagInstance) is refused.
func (p *Provisioner) Provision(ctx context.Context, claim provider.BucketClaim) (provider.Bucket, provider.BucketKey, error) {
	if err := ptype.ValidBucketName(claim.Name); err != nil {
		return ptype.Bucket{}, ptype.BucketKey{}, err
	}
	if err := ValidUser(claim.Owner); err != nil {
		return ptype.Bucket{}, ptype.BucketKey{}, err
	}
	if claim.Name == HealthBucket {
		return ptype.Bucket{}, ptype.BucketKey{}, fmt.Errorf("bucket name %q: reserved for the server's health check", claim.Name)
	}
	if claim.MaxBytes < 0 {
		return ptype.Bucket{}, ptype.BucketKey{}, fmt.Errorf("bucket %q: maxBytes %d < 0", claim.Name, claim.MaxBytes)
	}
	tags := maps.Clone(claim.Tags)
	if tags == nil {
		tags = map[string]string{}
	}
	if p.o.Instance != "" {
		tags[provider.TagInstance] = p.o.Instance
	}
	if err := validTags(tags); err != nil {
		return ptype.Bucket{}, ptype.BucketKey{}, fmt.Errorf("bucket %q: %w", claim.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(claim.Name)})
	switch code := s3client.ErrorCode(err); {
	case err == nil:
		p.o.Log.Info("bucket created", "bucket", claim.Name)
	case code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists":
		old, err := p.tags(ctx, claim.Name)
		if err != nil {
			return ptype.Bucket{}, ptype.BucketKey{}, err
		}
		if in := old[provider.TagInstance]; in != "" && in != p.o.Instance {
			return ptype.Bucket{}, ptype.BucketKey{}, fmt.Errorf("bucket %q exists and belongs to kloud instance %q", claim.Name, in)
		}
	default:
		return ptype.Bucket{}, ptype.BucketKey{}, fmt.Errorf("create bucket %q: %w", claim.Name, err)
	}
	if err := p.putTags(ctx, claim.Name, tags); err != nil {
		return ptype.Bucket{}, ptype.BucketKey{}, err
	}
	if claim.MaxBytes > 0 {
		mb := (claim.MaxBytes + 1<<20 - 1) >> 20
		if _, err := p.shell(ctx, fmt.Sprintf("s3.bucket.quota -name=%s -op=set -sizeMB=%d", claim.Name, mb)); err != nil {
			return ptype.Bucket{}, ptype.BucketKey{}, fmt.Errorf("bucket %q quota: %w", claim.Name, err)
		}
	}
	k, err := p.grant(ctx, claim.Name, claim.Owner, ptype.BucketWrite)
	if err != nil {
		return ptype.Bucket{}, ptype.BucketKey{}, err
	}
	return p.bucket(claim.Name, tags), k, nil
}

// Grant gives user access to bucket (provider.ErrBucketNotFound if there is none) and returns
// the user's key: the same key at every call, with the access asked for.
func (p *Provisioner) Grant(ctx context.Context, bucket, user string, access provider.BucketAccess) (provider.BucketKey, error) {
	if err := ptype.ValidBucketName(bucket); err != nil {
		return ptype.BucketKey{}, err
	}
	if err := ValidUser(user); err != nil {
		return ptype.BucketKey{}, err
	}
	if err := access.Valid(); err != nil {
		return ptype.BucketKey{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.s3.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)}); err != nil {
		if notFound(err) {
			return ptype.BucketKey{}, fmt.Errorf("bucket %q: %w", bucket, provider.ErrBucketNotFound)
		}
		return ptype.BucketKey{}, fmt.Errorf("bucket %q: %w", bucket, err)
	}
	return p.grant(ctx, bucket, user, access)
}

// grant makes user's identity for bucket exactly what access asks: the derived key only, the
// access's actions only. New actions and the key are added before anything is taken away, so
// a user changing from read to write never loses read meanwhile. Called with p.mu held.
func (p *Provisioner) grant(ctx context.Context, bucket, user string, access ptype.BucketAccess) (ptype.BucketKey, error) {
	k := p.key(bucket, user, access)
	name := identity(bucket, user)
	cfg, err := p.config(ctx)
	if err != nil {
		return k, err
	}
	want := actions(bucket, access)
	id, found := cfg.find(name)
	var missing, extra, extraKeys []string
	hasKey := false
	for _, a := range want {
		if !slices.Contains(id.Actions, a) {
			missing = append(missing, a)
		}
	}
	for _, a := range id.Actions {
		if !slices.Contains(want, a) {
			extra = append(extra, a)
		}
	}
	for _, c := range id.Credentials {
		if c.AccessKey == k.AccessKey && c.SecretKey == k.SecretKey {
			hasKey = true
		} else if c.AccessKey != k.AccessKey {
			extraKeys = append(extraKeys, c.AccessKey)
		}
	}
	if !found || !hasKey || len(missing) > 0 {
		acts := missing
		if len(acts) == 0 {
			acts = want
		}
		cmd := fmt.Sprintf("s3.configure -user=%s -access_key=%s -secret_key=%s -actions=%s -apply", name, k.AccessKey, k.SecretKey, strings.Join(acts, ","))
		if _, err := p.shell(ctx, cmd); err != nil {
			return k, fmt.Errorf("grant %s access to bucket %q to %q: %w", access, bucket, user, err)
		}
	}
	if len(extra) > 0 {
		if _, err := p.shell(ctx, fmt.Sprintf("s3.configure -user=%s -delete -actions=%s -apply", name, strings.Join(extra, ","))); err != nil {
			return k, fmt.Errorf("grant %s access to bucket %q to %q: %w", access, bucket, user, err)
		}
	}
	for _, ak := range extraKeys {
		if _, err := p.shell(ctx, fmt.Sprintf("s3.configure -user=%s -delete -access_key=%s -apply", name, ak)); err != nil {
			return k, fmt.Errorf("grant %s access to bucket %q to %q: %w", access, bucket, user, err)
		}
	}
	if !found || !hasKey || len(missing)+len(extra)+len(extraKeys) > 0 {
		p.o.Log.Info("bucket access granted", "bucket", bucket, "user", user, "access", access)
	}
	return k, nil
}

// Revoke removes user's identity for bucket; a user without one is no error.
func (p *Provisioner) Revoke(ctx context.Context, bucket, user string) error {
	if err := ptype.ValidBucketName(bucket); err != nil {
		return err
	}
	if err := ValidUser(user); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.revoke(ctx, identity(bucket, user))
}

// revoke deletes the identity name, if there is one. Called with p.mu held.
func (p *Provisioner) revoke(ctx context.Context, name string) error {
	_, err := p.shell(ctx, fmt.Sprintf("s3.configure -user=%s -delete -apply", name))
	if err != nil && !strings.Contains(err.Error(), "NotFound") {
		return fmt.Errorf("revoke %s: %w", name, err)
	}
	if err == nil {
		p.o.Log.Info("bucket access revoked", "identity", name)
	}
	return nil
}

// Delete revokes every key to bucket; then, without retain, removes its objects and the
// bucket, or, with retain, keeps them and re-tags the bucket TagRetained instead of
// TagInstance (Buckets no longer lists it). A bucket that is gone is no error; one of another
// kloud instance (its TagInstance) is refused.
func (p *Provisioner) Delete(ctx context.Context, bucket string, retain bool) error {
	if err := ptype.ValidBucketName(bucket); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	tags, err := p.tags(ctx, bucket)
	switch {
	case notFound(err):
	case err != nil:
		return err
	case tags[provider.TagInstance] != "" && tags[provider.TagInstance] != p.o.Instance:
		return fmt.Errorf("bucket %q belongs to kloud instance %q", bucket, tags[provider.TagInstance])
	}
	cfg, err := p.config(ctx)
	if err != nil {
		return err
	}
	for _, id := range cfg.Identities {
		if strings.HasPrefix(id.Name, identityPrefix(bucket)) {
			if err := p.revoke(ctx, id.Name); err != nil {
				return err
			}
		}
	}
	if retain {
		if tags == nil { // no bucket
			return nil
		}
		if _, ok := tags[TagRetained]; ok && tags[provider.TagInstance] == "" {
			return nil
		}
		delete(tags, provider.TagInstance)
		tags[TagRetained] = time.Now().UTC().Format(time.RFC3339)
		if err := p.putTags(ctx, bucket, tags); err != nil && !notFound(err) {
			return err
		}
		p.o.Log.Info("bucket retained", "bucket", bucket)
		return nil
	}
	if err := p.empty(ctx, bucket); err != nil {
		if notFound(err) {
			return nil
		}
		return fmt.Errorf("empty bucket %q: %w", bucket, err)
	}
	if _, err := p.s3.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)}); err != nil && !notFound(err) {
		return fmt.Errorf("delete bucket %q: %w", bucket, err)
	}
	p.o.Log.Info("bucket deleted", "bucket", bucket)
	return nil
}

// empty removes every object and unfinished multipart upload of bucket.
func (p *Provisioner) empty(ctx context.Context, bucket string) error {
	ups, err := p.s3.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
	if err != nil {
		return err
	}
	for _, u := range ups.Uploads {
		if _, err := p.s3.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: aws.String(bucket), Key: u.Key, UploadId: u.UploadId}); err != nil && !notFound(err) {
			return err
		}
	}
	pages := s3.NewListObjectsV2Paginator(p.s3, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return err
		}
		if len(page.Contents) == 0 {
			continue
		}
		ids := make([]types.ObjectIdentifier, 0, len(page.Contents))
		for _, o := range page.Contents {
			ids = append(ids, types.ObjectIdentifier{Key: o.Key})
		}
		out, err := p.s3.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String(bucket), Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)}})
		if err != nil {
			return err
		}
		if len(out.Errors) > 0 {
			e := out.Errors[0]
			return fmt.Errorf("delete %q: %s: %s", aws.ToString(e.Key), aws.ToString(e.Code), aws.ToString(e.Message))
		}
	}
	return nil
}

// Buckets lists the buckets tagged with this provisioner's Instance, sorted by name.
func (p *Provisioner) Buckets(ctx context.Context) ([]provider.Bucket, error) {
	out, err := p.s3.ListBuckets(ctx, &s3.ListBucketsInput{})
	if err != nil {
		return nil, fmt.Errorf("list buckets: %w", err)
	}
	var bs []ptype.Bucket
	for _, b := range out.Buckets {
		name := aws.ToString(b.Name)
		tags, err := p.tags(ctx, name)
		if notFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if p.o.Instance != "" && tags[provider.TagInstance] == p.o.Instance {
			bs = append(bs, p.bucket(name, tags))
		}
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].Name < bs[j].Name })
	return bs, nil
}

// EnforceQuotas makes buckets over their quota read-only and those back under it writable
// (weed shell s3.bucket.quota.enforce -apply); Server runs it every Options.QuotaInterval.
func (p *Provisioner) EnforceQuotas(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.shell(ctx, "s3.bucket.quota.enforce -apply")
	return err
}

// tags returns bucket's tags (none: an empty map).
func (p *Provisioner) tags(ctx context.Context, bucket string) (map[string]string, error) {
	out, err := p.s3.GetBucketTagging(ctx, &s3.GetBucketTaggingInput{Bucket: aws.String(bucket)})
	tags := map[string]string{}
	if s3client.ErrorCode(err) == "NoSuchTagSet" || s3client.ErrorCode(err) == "NoSuchTagSetError" {
		return tags, nil
	}
	if err != nil {
		if notFound(err) {
			return nil, fmt.Errorf("bucket %q: %w", bucket, err)
		}
		return nil, fmt.Errorf("bucket %q tags: %w", bucket, err)
	}
	for _, t := range out.TagSet {
		tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return tags, nil
}

func (p *Provisioner) putTags(ctx context.Context, bucket string, tags map[string]string) error {
	set := make([]types.Tag, 0, len(tags))
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		set = append(set, types.Tag{Key: aws.String(k), Value: aws.String(tags[k])})
	}
	if _, err := p.s3.PutBucketTagging(ctx, &s3.PutBucketTaggingInput{Bucket: aws.String(bucket), Tagging: &types.Tagging{TagSet: set}}); err != nil {
		return fmt.Errorf("tag bucket %q: %w", bucket, err)
	}
	return nil
}

// validTags checks tags against S3's limits: at most 50, keys of 1 to 128 and values of at most
// 256 characters among letters, digits, spaces and + - = . _ : / @.
func validTags(tags map[string]string) error {
	if len(tags) > 50 {
		return fmt.Errorf("%d tags, at most 50", len(tags))
	}
	for k, v := range tags {
		if k == "" || len(k) > 128 || len(v) > 256 || !tagRE.MatchString(k) || !tagRE.MatchString(v) {
			return fmt.Errorf("tag %q=%q: want a key of 1 to 128 and a value of at most 256 letters, digits, spaces and + - = . _ : / @", k, v)
		}
	}
	return nil
}

// notFound reports whether err says the bucket is not there.
func notFound(err error) bool {
	var nb *types.NoSuchBucket
	var nf *types.NotFound
	c := s3client.ErrorCode(err)
	return errors.As(err, &nb) || errors.As(err, &nf) || c == "NoSuchBucket" || c == "NotFound"
}

// iamConfig is what `s3.configure` prints: SeaweedFS's identities.
type iamConfig struct {
	Identities []iamIdentity `json:"identities"`
}

type iamIdentity struct {
	Name        string `json:"name"`
	Credentials []struct {
		AccessKey string `json:"accessKey"`
		SecretKey string `json:"secretKey"`
	} `json:"credentials"`
	Actions []string `json:"actions"`
}

func (c iamConfig) find(name string) (iamIdentity, bool) {
	for _, id := range c.Identities {
		if id.Name == name {
			return id, true
		}
	}
	return iamIdentity{}, false
}

// config reads the identities.
func (p *Provisioner) config(ctx context.Context) (iamConfig, error) {
	out, err := p.shell(ctx, "s3.configure")
	if err != nil {
		return iamConfig{}, err
	}
	var c iamConfig
	i := strings.IndexByte(out, '{')
	if i < 0 {
		return c, fmt.Errorf("weed shell s3.configure: no configuration in its output %q", out)
	}
	if err := json.Unmarshal([]byte(out[i:]), &c); err != nil {
		return c, fmt.Errorf("weed shell s3.configure: %w", err)
	}
	return c, nil
}

// shell runs one weed shell command and returns its output. Errors name the command and its
// user, never its keys.
func (p *Provisioner) shell(ctx context.Context, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args := []string{"-logtostderr", "shell", "-master=" + p.o.Master, "-connectTimeout=20s"}
	if p.o.Filer != "" {
		args = append(args, "-filer="+p.o.Filer)
	}
	bin := p.o.Weed
	if p.o.Netns != nil {
		ns := p.o.Netns()
		if ns == "" {
			return "", errors.New("weed shell: the S3 server is not running")
		}
		bin, args = "nsenter", append([]string{"--net=" + ns, "--", p.o.Weed}, args...)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = strings.NewReader(command + "\n")
	if p.o.ShellDir != "" {
		cmd.Dir = p.o.ShellDir
		cmd.Env = append(os.Environ(), "TMPDIR="+p.o.ShellDir, "HOME="+p.o.ShellDir)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	what := redact(command)
	p.o.Log.Debug("weed shell", "command", what, "took", time.Since(start).Round(time.Millisecond))
	msg := strings.TrimSpace(stderr.String())
	switch {
	case ctx.Err() != nil:
		return "", fmt.Errorf("weed shell %s: %w", what, ctx.Err())
	case err != nil && msg != "":
		return "", fmt.Errorf("weed shell %s: %s (%w)", what, msg, err)
	case err != nil:
		return "", fmt.Errorf("weed shell %s: %w", what, err)
	case strings.Contains(msg, "error:") || strings.HasPrefix(msg, "unknown command"):
		return "", fmt.Errorf("weed shell %s: %s", what, msg)
	}
	return stdout.String(), nil
}

// redact is a shell command without its secret key.
func redact(command string) string {
	f := strings.Fields(command)
	for i, a := range f {
		if strings.HasPrefix(a, "-secret_key=") {
			f[i] = "-secret_key=xxxxx"
		}
	}
	return strings.Join(f, " ")
}
