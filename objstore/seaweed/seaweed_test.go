package seaweed_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/objstore/bucketcheck"
	"github.com/kloud-dev/kloud/objstore/s3client"
	"github.com/kloud-dev/kloud/objstore/seaweed"
	"github.com/kloud-dev/kloud/objstore/seaweed/seaweedtest"
	"github.com/kloud-dev/kloud/provider/ptype"
)

// TestContract: the provisioner passes the bucket provisioner contract on a real SeaweedFS.
func TestContract(t *testing.T) {
	t.Parallel()
	s := seaweedtest.Start(t)
	bucketcheck.Run(t, s.Provisioner(seaweedtest.Name("inst")), seaweedtest.Name("kc"))
}

func admin(s *seaweed.Server) *s3.Client {
	ak, sk := s.AdminKey()
	return s3client.New(s.Endpoint(), "", ak, sk)
}

// weedShell runs one weed shell command against s.
func weedShell(t *testing.T, s *seaweed.Server, command string) string {
	t.Helper()
	cmd := exec.Command(os.Getenv(seaweedtest.EnvWeed), "-logtostderr", "shell", "-master="+s.Master(), "-filer="+s.Filer())
	cmd.Stdin = strings.NewReader(command + "\n")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "TMPDIR="+cmd.Dir, "HOME="+cmd.Dir)
	out, err := cmd.CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("error:")) {
		t.Fatalf("weed shell %s: %v\n%s", command, err, out)
	}
	return string(out)
}

// TestProvisionCompletesAfterCrash: a Provision interrupted between the server's change and
// its end is completed by the next one: a bucket without its owner's identity, an identity
// without its bucket (and with a stale key, which goes).
func TestProvisionCompletesAfterCrash(t *testing.T) {
	t.Parallel()
	s := seaweedtest.Start(t)
	p := s.Provisioner(seaweedtest.Name("inst"))
	ctx := t.Context()

	t.Run("BucketWithoutIdentity", func(t *testing.T) {
		name := seaweedtest.Name("crash-b")
		t.Cleanup(func() { p.Delete(context.Background(), name, false) })
		if _, err := admin(s).CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
			t.Fatal(err)
		}
		b, k, err := p.Provision(ctx, ptype.BucketClaim{Name: name, Owner: "alice"})
		if err != nil {
			t.Fatalf("Provision: %v", err)
		}
		eventually(t, "the owner writes", func() error { return put(ctx, s3client.ForKey(b, k), name, "x", "1") })
		if bs, _ := p.Buckets(ctx); len(bs) != 1 || bs[0].Name != name {
			t.Errorf("Buckets: %v, want %s (tagged at the second Provision)", bs, name)
		}
	})

	t.Run("IdentityWithoutBucket", func(t *testing.T) {
		name := seaweedtest.Name("crash-i")
		t.Cleanup(func() { p.Delete(context.Background(), name, false) })
		weedShell(t, s, "s3.configure -user=kb_"+name+"_alice -access_key=KBSTALESTALESTALE001 -secret_key=stalestalestalestalestalestalestalestale -actions=Read:"+name+",Admin:"+name+" -apply")
		b, k, err := p.Provision(ctx, ptype.BucketClaim{Name: name, Owner: "alice"})
		if err != nil {
			t.Fatalf("Provision: %v", err)
		}
		eventually(t, "the owner writes", func() error { return put(ctx, s3client.ForKey(b, k), name, "x", "1") })
		stale := s3client.New(b.Endpoint, b.Region, "KBSTALESTALESTALE001", "stalestalestalestalestalestalestalestale")
		eventually(t, "the stale key is refused", func() error {
			if _, err := stale.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(name)}); !bucketcheck.Denied(err) {
				return errorf("stale key lists: %v", err)
			}
			return nil
		})
		cfg := weedShell(t, s, "s3.configure")
		if strings.Contains(cfg, "KBSTALESTALESTALE001") || strings.Contains(cfg, "Admin:"+name) {
			t.Errorf("the stale key or action is still configured:\n%s", cfg)
		}
	})
}

// TestQuota: a bucket's MaxBytes is SeaweedFS's bucket quota; once enforced, a bucket over it
// refuses writes (403) and still reads.
func TestQuota(t *testing.T) {
	t.Parallel()
	s := seaweedtest.Start(t)
	p := s.Provisioner(seaweedtest.Name("inst"))
	ctx := t.Context()
	name := seaweedtest.Name("quota")
	t.Cleanup(func() { p.Delete(context.Background(), name, false) })
	b, k, err := p.Provision(ctx, ptype.BucketClaim{Name: name, Owner: "alice", MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c := s3client.ForKey(b, k)
	big := make([]byte, 3<<20)
	rand.Read(big)
	eventually(t, "the owner writes 3 MiB", func() error { return put(ctx, c, name, "big", string(big)) })
	eventually(t, "writes are refused over the quota", func() error {
		if err := p.EnforceQuotas(ctx); err != nil {
			return err
		}
		if err := put(ctx, c, name, "more", "x"); !bucketcheck.Denied(err) {
			return errorf("write over the quota: %v", err)
		}
		return nil
	})
	if _, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(name), Key: aws.String("big")}); err != nil {
		t.Errorf("read over the quota: %v", err)
	}
}

// TestServerRestarts: a weed that dies is started again on the same ports with the same admin
// key and data; Stop ends it and leaves no socket in /tmp; a new Start on the same directory
// finds the admin key, the ports and the data again.
func TestServerRestarts(t *testing.T) {
	t.Parallel()
	bin := os.Getenv(seaweedtest.EnvWeed)
	if bin == "" {
		testutil.Unavailable(t, "$%s is not set", seaweedtest.EnvWeed)
	}
	dir := t.TempDir()
	weedOut := weedOutput(t)
	o := seaweed.Options{Bin: bin, Dir: filepath.Join(dir, "weed"), Log: testutil.Logger(t), Out: weedOut}
	start := time.Now()
	s, err := seaweed.Start(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started in %s; pid %d; RSS %s", time.Since(start).Round(time.Millisecond), s.PID(), rss(s.PID()))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			s.Stop()
		}
	})
	if fi, err := os.Stat(filepath.Join(o.Dir, "admin.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin key file: %v %v", fi, err)
	}
	ctx := t.Context()
	p := s.Provisioner("restart")
	name := seaweedtest.Name("restart")
	c := ownerWrites(ctx, t, p, name)
	t.Logf("RSS after a bucket and an object: %s", rss(s.PID()))

	old := s.PID()
	start = time.Now()
	if err := syscallKill(old); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() bool { return s.PID() != 0 && s.PID() != old }, "weed not restarted")
	eventually(t, "the data after a restart", func() error { return get(ctx, c, name, "kept") })
	t.Logf("restarted and serving after %s", time.Since(start).Round(time.Millisecond))

	endpoint, sockets := s.Endpoint(), s.Sockets()
	start = time.Now()
	s.Stop()
	stopped = true
	t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
	for _, sock := range sockets {
		if _, err := os.Lstat(sock); err == nil {
			t.Errorf("%s left behind", sock)
		}
	}
	start = time.Now()
	s2, err := seaweed.Start(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started again in %s", time.Since(start).Round(time.Millisecond))
	defer s2.Stop()
	if s2.Endpoint() != endpoint {
		t.Errorf("endpoint %s after a restart, was %s", s2.Endpoint(), endpoint)
	}
	if bs, err := s2.Provisioner("restart").Buckets(ctx); err != nil || len(bs) != 1 || bs[0].Name != name {
		t.Errorf("Buckets after a new Start: %v, %v", bs, err)
	}
	eventually(t, "the data after a new Start", func() error { return get(ctx, c, name, "kept") })
}

func rss(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.Join(strings.Fields(l)[1:], " ")
		}
	}
	return "?"
}

// TestIsolated: with Options.Isolate weed runs in a network namespace of its own. The provisioner
// contract passes through the S3 forwarder (and weed shell through nsenter), and from the host,
// where sandboxed plugins and terraform run, the master, volume server and filer, which take no
// keys, do not answer on their ports; a restarted weed is reached the same way.
func TestIsolated(t *testing.T) {
	t.Parallel()
	testutil.RequireRoot(t)
	bin := os.Getenv(seaweedtest.EnvWeed)
	if bin == "" {
		testutil.Unavailable(t, "$%s is not set", seaweedtest.EnvWeed)
	}
	weedOut := weedOutput(t)
	s, err := seaweed.Start(t.Context(), seaweed.Options{Bin: bin, Dir: filepath.Join(t.TempDir(), "weed"), Isolate: true, Log: testutil.Logger(t), Out: weedOut})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	for _, addr := range []string{s.Master(), s.Filer()} {
		host, ports, _ := strings.Cut(addr, ":")
		http, grpc, _ := strings.Cut(ports, ".")
		for _, port := range []string{http, grpc} {
			if c, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), time.Second); err == nil {
				c.Close()
				t.Errorf("%s answers on the host: weed is not isolated", net.JoinHostPort(host, port))
			}
		}
	}
	bucketcheck.Run(t, s.Provisioner("isolated"), "iso")

	ctx := t.Context()
	p := s.Provisioner("isolated")
	name := seaweedtest.Name("iso")
	c := ownerWrites(ctx, t, p, name)
	old := s.PID()
	if err := syscallKill(old); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, func() bool { return s.PID() != 0 && s.PID() != old }, "weed not restarted")
	eventually(t, "the data after a restart, through the forwarder", func() error { return get(ctx, c, name, "kept") })
	if _, err := p.Grant(ctx, name, "bob", ptype.BucketRead); err != nil {
		t.Errorf("grant after a restart (weed shell in the new namespace): %v", err)
	}
}

// weedOutput collects weed's output, logged when the test failed.
func weedOutput(t *testing.T) *lockedBuffer {
	var out bytes.Buffer
	w := &lockedBuffer{b: &out}
	t.Cleanup(func() {
		if t.Failed() {
			w.mu.Lock()
			t.Logf("weed's output:\n%s", out.String())
			w.mu.Unlock()
		}
	})
	return w
}

// ownerWrites provisions bucket name for alice and waits until her key writes "kept" there.
func ownerWrites(ctx context.Context, t *testing.T, p *seaweed.Provisioner, name string) *s3.Client {
	t.Helper()
	b, k, err := p.Provision(ctx, ptype.BucketClaim{Name: name, Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	c := s3client.ForKey(b, k)
	eventually(t, "the owner writes", func() error { return put(ctx, c, name, "kept", "data") })
	return c
}
