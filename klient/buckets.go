package klient

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kloud-dev/kloud/internal/atomicfile"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/klient/klientapi"
	"github.com/kloud-dev/kloud/klient/webterm"
)

// Buckets: klient.setBuckets (klientapi.MethodSetBuckets) gives the machine its stack's
// object buckets. klient writes, for the owner's account, ~/.config/kloud/buckets/<label>.env
// (0600, the owner's) with KLOUD_BUCKET_<LABEL>_{NAME,ENDPOINT,REGION,ACCESS_KEY_ID,
// SECRET_ACCESS_KEY} (and, when the stack has one bucket, the AWS_* variables every S3 client
// reads), and /etc/profile.d/kloud-buckets.sh, which sources the login user's files. The keys
// are the owner's: the files are readable by the owner's account only (and root). The owner
// has sudo on the machine, so writing into the owner's home as root gives the owner nothing.

// BucketsDir is where the owner's bucket files live, under the account's home.
const BucketsDir = ".config/kloud/buckets"

// BucketsProfile is the login shells' script that sources them, under klient's root.
const BucketsProfile = "etc/profile.d/kloud-buckets.sh"

const bucketsProfileScript = `# Written by klient (kloud): the stack's object buckets, docs/buckets.md.
for f in "$HOME/` + BucketsDir + `"/*.env; do
  [ -r "$f" ] && . "$f"
done
unset f
`

func (kl *Klient) handleBuckets() {
	kl.kite.Handle(klientapi.MethodSetBuckets, kite.Typed(kl.setBuckets))
}

func (kl *Klient) setBuckets(ctx context.Context, r *kite.Request, p *klientapi.SetBucketsParams) (any, error) {
	if !r.Conn.Dialed() {
		return nil, fmt.Errorf("%s: only kloud, on the connection klient dialed, sets buckets: %w", r.Method, kite.ErrPermission)
	}
	files, err := writeBuckets(kl.opts.Root, kl.opts.Owner, p.Buckets)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Method, err)
	}
	kl.log.Info("buckets delivered", "count", len(p.Buckets))
	return klientapi.SetBucketsResult{Files: files}, nil
}

// writeBuckets writes the bucket files of account owner (machine root root) and removes those
// of buckets no longer listed.
func writeBuckets(root, owner string, bs []klientapi.BucketEnv) ([]string, error) {
	home, uid, gid, err := webterm.AccountHome(root, owner)
	if err != nil {
		return nil, err
	}
	asRoot := os.Geteuid() == 0
	// ~/.config, ~/.config/kloud, ~/.config/kloud/buckets: created as the owner's.
	dir := home
	for _, part := range strings.Split(BucketsDir, "/") {
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
			return nil, fmt.Errorf("bucket files: %w", err)
		} else if err == nil && asRoot {
			if err := os.Lchown(dir, uid, gid); err != nil {
				return nil, fmt.Errorf("bucket files: %w", err)
			}
		}
	}
	var files, keep []string
	for _, b := range bs {
		name := b.Label + ".env"
		path := filepath.Join(dir, name)
		if err := writeOwned(path, bucketEnvFile(b, len(bs) == 1), 0o600, asRoot, uid, gid); err != nil {
			return nil, err
		}
		files, keep = append(files, path), append(keep, name)
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.env"))
	if err != nil {
		return nil, err
	}
	for _, f := range old {
		if !slices.Contains(keep, filepath.Base(f)) {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				return nil, fmt.Errorf("bucket files: %w", err)
			}
		}
	}
	profile := filepath.Join(root, BucketsProfile)
	if err := os.MkdirAll(filepath.Dir(profile), 0o755); err != nil {
		return nil, fmt.Errorf("bucket files: %w", err)
	}
	if err := atomicfile.WriteFile(profile, []byte(bucketsProfileScript), 0o644); err != nil {
		return nil, fmt.Errorf("bucket files: %w", err)
	}
	return append(files, profile), nil
}

// bucketEnvFile is the shell file of bucket b (single: the stack's only bucket, which also
// sets the AWS_* variables). Validate keeps quotes and line breaks out of the values.
func bucketEnvFile(b klientapi.BucketEnv, single bool) []byte {
	var s strings.Builder
	s.WriteString("# Written by klient (kloud): bucket " + b.Label + " of this machine's stack, docs/buckets.md.\n")
	p := klientapi.BucketEnvName(b.Label)
	for _, kv := range [][2]string{{p + "_NAME", b.Bucket}, {p + "_ENDPOINT", b.Endpoint}, {p + "_REGION", b.Region},
		{p + "_ACCESS_KEY_ID", b.AccessKeyID}, {p + "_SECRET_ACCESS_KEY", b.SecretAccessKey}} {
		fmt.Fprintf(&s, "export %s='%s'\n", kv[0], kv[1])
	}
	if single {
		for _, kv := range [][2]string{{"AWS_ENDPOINT_URL", b.Endpoint}, {"AWS_REGION", b.Region},
			{"AWS_ACCESS_KEY_ID", b.AccessKeyID}, {"AWS_SECRET_ACCESS_KEY", b.SecretAccessKey}} {
			fmt.Fprintf(&s, "export %s='%s'\n", kv[0], kv[1])
		}
	}
	return []byte(s.String())
}

// writeOwned replaces path by data with mode perm, owned by uid:gid when klient is root.
func writeOwned(path string, data []byte, perm os.FileMode, asRoot bool, uid, gid int) error {
	f, err := atomicfile.Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if asRoot {
		if err := f.Chown(uid, gid); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return f.Commit()
}
