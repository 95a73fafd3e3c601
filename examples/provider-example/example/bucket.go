package example

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"

	"github.com/kloud-dev/kloud/objstore/seaweed"
	"github.com/kloud-dev/kloud/provider"
)

// Buckets (capability "bucket", provider.BucketProvisioner): a stack's template may claim object
// buckets, and kloud asks a provider of the stack to provision them. A provider that can sets
// Provider.Buckets; kloud then calls its five methods (as a plugin: over the wire,
// provider/plugin/bucket.go), each idempotent: kloud calls again after a crash or a lost answer.
//
// The example keeps no buckets of its own: it provisions them on a SeaweedFS server it is
// configured for (S3), with kloud's provisioner for SeaweedFS (objstore/seaweed), which already
// implements the contract; a provider for a cloud would call its object store's API here. Without
// a configuration, Provider.Buckets stays nil and the example does not advertise "bucket".

// S3 is the S3 server (SeaweedFS) the example provisions buckets on. A launched plugin reads it
// from S3File in its state directory (kloud passes a plugin nothing else of its environment); a
// plugin you start yourself may take it from the environment instead (LoadS3).
type S3 struct {
	// URL is the S3 endpoint the provider uses, with the admin key, e.g. http://127.0.0.1:8333.
	URL string `json:"url"`
	// PublicURL is the S3 endpoint machines use (default URL).
	PublicURL string `json:"publicUrl,omitempty"`
	// Region to sign requests for (default: the provisioner's, us-east-1).
	Region string `json:"region,omitempty"`
	// Master is the SeaweedFS master through which `weed shell` configures keys, as weed shell
	// takes it: host:port.grpcPort, e.g. 127.0.0.1:9333.19333.
	Master string `json:"master"`
	// Weed is the weed binary (a sandboxed plugin must be able to run it: e.g. a copy in its
	// state directory).
	Weed string `json:"weed"`
	// AccessKey and SecretKey are the server's admin key.
	AccessKey string `json:"accessKey"`
	SecretKey string `json:"secretKey"`
}

// S3File is the name of the S3 configuration in the plugin's state directory.
const S3File = "s3.json"

// The environment LoadS3 reads when there is no S3File.
const (
	EnvS3URL       = "KLOUD_EXAMPLE_S3_URL"
	EnvS3PublicURL = "KLOUD_EXAMPLE_S3_PUBLIC_URL"
	EnvS3Region    = "KLOUD_EXAMPLE_S3_REGION"
	EnvS3Master    = "KLOUD_EXAMPLE_S3_MASTER"
	EnvS3AccessKey = "KLOUD_EXAMPLE_S3_ACCESS_KEY"
	EnvS3SecretKey = "KLOUD_EXAMPLE_S3_SECRET_KEY"
	EnvWeed        = "KLOUD_EXAMPLE_WEED"
)

// Valid checks a configuration; errors name the field and never show the secret.
func (c *S3) Valid() error {
	for _, u := range []struct{ name, v string }{{"url", c.URL}, {"publicUrl", c.PublicURL}} {
		if u.v == "" && u.name == "publicUrl" {
			continue
		}
		p, err := url.Parse(u.v)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("s3 %s %q: want an http or https URL", u.name, u.v)
		}
	}
	if _, _, err := net.SplitHostPort(c.Master); err != nil {
		return fmt.Errorf("s3 master %q: want host:port.grpcPort", c.Master)
	}
	switch {
	case c.Weed == "":
		return errors.New("s3 weed: the weed binary is required")
	case c.AccessKey == "" || c.SecretKey == "":
		return errors.New("s3 accessKey and secretKey: the server's admin key is required")
	}
	return nil
}

// LoadS3 returns the S3 configuration in dir/S3File, else the one in the environment (getenv:
// os.Getenv; EnvS3URL set), else nil: no buckets. A configuration that is there but incomplete
// or unreadable is an error.
func LoadS3(dir string, getenv func(string) string) (*S3, error) {
	var c S3
	path := filepath.Join(dir, S3File)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := c.Valid(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return &c, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("s3 configuration: %w", err)
	case getenv(EnvS3URL) == "":
		return nil, nil
	}
	c = S3{URL: getenv(EnvS3URL), PublicURL: getenv(EnvS3PublicURL), Region: getenv(EnvS3Region), Master: getenv(EnvS3Master),
		Weed: getenv(EnvWeed), AccessKey: getenv(EnvS3AccessKey), SecretKey: getenv(EnvS3SecretKey)}
	if err := c.Valid(); err != nil {
		return nil, fmt.Errorf("environment %s...: %w", EnvS3URL, err)
	}
	return &c, nil
}

// buckets is the example's provider.BucketProvisioner (Provider.Buckets): SeaweedFS's
// provisioner, made on first use with the example's kloud instance id, so that Buckets lists
// this kloud's buckets only. Each call is logged (never a key).
type buckets struct {
	e *example

	mu sync.Mutex
	p  provider.BucketProvisioner // Options.Buckets, or made from Options.S3 on first use
}

// provisioner returns the provisioner, making it on first use.
func (b *buckets) provisioner() (provider.BucketProvisioner, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.p != nil {
		return b.p, nil
	}
	inst, err := b.e.instanceID()
	if err != nil {
		return nil, err
	}
	// weed shell's working, temporary and home directory: the provider's own, nothing in /tmp.
	shellDir := filepath.Join(b.e.o.Dir, "weed-shell")
	if err := os.MkdirAll(shellDir, 0o700); err != nil {
		return nil, fmt.Errorf("example: buckets: %w", err)
	}
	s := b.e.o.S3
	p, err := seaweed.NewProvisioner(seaweed.ProvisionerOptions{Endpoint: s.URL, PublicEndpoint: s.PublicURL, Region: s.Region,
		Master: s.Master, Weed: s.Weed, AdminAccessKey: s.AccessKey, AdminSecretKey: s.SecretKey, Instance: inst,
		Log: b.e.o.Logger, ShellDir: shellDir})
	if err != nil {
		return nil, fmt.Errorf("example: buckets: %w", err)
	}
	b.p = p
	return p, nil
}

func (b *buckets) Provision(ctx context.Context, claim provider.BucketClaim) (provider.Bucket, provider.BucketKey, error) {
	b.e.o.Logger.Info("bucket provision", "bucket", claim.Name, "owner", claim.Owner, "maxBytes", claim.MaxBytes)
	p, err := b.provisioner()
	if err != nil {
		return provider.Bucket{}, provider.BucketKey{}, err
	}
	return p.Provision(ctx, claim)
}

func (b *buckets) Grant(ctx context.Context, bucket, user string, access provider.BucketAccess) (provider.BucketKey, error) {
	b.e.o.Logger.Info("bucket grant", "bucket", bucket, "user", user, "access", access)
	p, err := b.provisioner()
	if err != nil {
		return provider.BucketKey{}, err
	}
	return p.Grant(ctx, bucket, user, access)
}

func (b *buckets) Revoke(ctx context.Context, bucket, user string) error {
	b.e.o.Logger.Info("bucket revoke", "bucket", bucket, "user", user)
	p, err := b.provisioner()
	if err != nil {
		return err
	}
	return p.Revoke(ctx, bucket, user)
}

func (b *buckets) Delete(ctx context.Context, bucket string, retain bool) error {
	b.e.o.Logger.Info("bucket delete", "bucket", bucket, "retain", retain)
	p, err := b.provisioner()
	if err != nil {
		return err
	}
	return p.Delete(ctx, bucket, retain)
}

func (b *buckets) Buckets(ctx context.Context) ([]provider.Bucket, error) {
	p, err := b.provisioner()
	if err != nil {
		return nil, err
	}
	return p.Buckets(ctx)
}
