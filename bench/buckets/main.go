// Command buckets measures kloud's S3 server (objstore/seaweed, SeaweedFS's weed) in the same
// run as its baselines:
//
//   - the provisioner's latency: Provision of a new bucket (create, tag, identity), Provision
//     again (the idempotent path), Grant read, Revoke, and how long after Revoke returns the S3
//     gateway refuses the key (polled every 10 ms);
//   - throughput: PUT and GET of a -mib MiB object through the S3 gateway with the bucket owner's
//     key (aws-sdk-go-v2, one PutObject: the SDK hashes the payload for its signature, as
//     clients do), against a plain HTTP PUT and GET of the same bytes to a file server on
//     loopback writing (and syncing, as weed's volume server does) the same disk: no S3, no
//     signatures, no SeaweedFS.
//
// By default it starts its own weed ($KLOUD_WEED, or -weed) in a directory under the cache, and
// removes it at the end, also on an error or Ctrl-C. With -s3-url (and -access-key, -secret-key,
// -bucket) it measures only PUT/GET against that bucket, say from inside a machine against the
// server kloud started, to compare with the same run from the host.
//
//	set -a && . /var/cache/kloud/env && set +a && go run ./bench/buckets [-n 10] [-mib 64] [-rounds 3]
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/kloud-dev/kloud/bench/internal/measure"
	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/objstore/s3client"
	"github.com/kloud-dev/kloud/objstore/seaweed"
	"github.com/kloud-dev/kloud/provider/ptype"
)

// putOptions are PutObject's options (-unsigned-payload: no payload hash in the signature).
var putOptions []func(*s3.Options)

type config struct {
	weed                string
	n, mib, rounds      int
	url, ak, sk, bucket string
	region              string
}

func main() {
	var c config
	flag.StringVar(&c.weed, "weed", os.Getenv("KLOUD_WEED"), "the weed binary")
	flag.IntVar(&c.n, "n", 10, "buckets provisioned")
	flag.IntVar(&c.mib, "mib", 64, "object size in MiB")
	flag.IntVar(&c.rounds, "rounds", 3, "PUT/GET rounds per side")
	flag.StringVar(&c.url, "s3-url", "", "measure only PUT/GET against this S3 endpoint (with -access-key, -secret-key, -bucket)")
	flag.StringVar(&c.ak, "access-key", "", "with -s3-url")
	flag.StringVar(&c.sk, "secret-key", "", "with -s3-url")
	flag.StringVar(&c.bucket, "bucket", "", "with -s3-url")
	flag.StringVar(&c.region, "region", "us-east-1", "with -s3-url")
	unsigned := flag.Bool("unsigned-payload", false, "sign PUTs with UNSIGNED-PAYLOAD (no SHA-256 of the body on the client)")
	flag.Parse()
	if *unsigned {
		putOptions = append(putOptions, s3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "buckets:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, c config) error {
	fmt.Printf("load average: %s; cpu: %s\n", measure.LoadAvg(), measure.CPUModel())
	body := make([]byte, c.mib<<20)
	rand.Read(body)
	if c.url != "" {
		if c.ak == "" || c.sk == "" || c.bucket == "" {
			return errors.New("-s3-url needs -access-key, -secret-key and -bucket")
		}
		return throughput(ctx, s3client.New(c.url, c.region, c.ak, c.sk), c.bucket, body, c.rounds, nil)
	}
	if c.weed == "" {
		return errors.New("no weed binary: set $KLOUD_WEED (scripts/setup.sh) or pass -weed")
	}
	dir, remove, err := testutil.RunDir("bench-buckets")
	if err != nil {
		return err
	}
	defer remove()
	start := time.Now()
	srv, err := seaweed.Start(ctx, seaweed.Options{Bin: c.weed, Dir: filepath.Join(dir, "weed")})
	if err != nil {
		return err
	}
	defer srv.Stop()
	fmt.Printf("weed ready in %s (pid %d, RSS %s)\n", time.Since(start).Round(time.Millisecond), srv.PID(), rss(srv.PID()))

	p := srv.Provisioner("bench")
	var prov, again, grant, revoke, applied []time.Duration
	var last ptype.Bucket
	var lastKey ptype.BucketKey
	for i := range c.n {
		claim := ptype.BucketClaim{Name: fmt.Sprintf("bench-%d-%d", time.Now().Unix(), i), Owner: "alice"}
		t0 := time.Now()
		b, k, err := p.Provision(ctx, claim)
		if err != nil {
			return err
		}
		prov = append(prov, time.Since(t0))
		t0 = time.Now()
		if _, _, err := p.Provision(ctx, claim); err != nil {
			return err
		}
		again = append(again, time.Since(t0))
		t0 = time.Now()
		rk, err := p.Grant(ctx, claim.Name, "bob", ptype.BucketRead)
		if err != nil {
			return err
		}
		grant = append(grant, time.Since(t0))
		reader := s3client.ForKey(b, rk)
		if err := poll(ctx, func() bool { return list(ctx, reader, claim.Name) == nil }); err != nil {
			return fmt.Errorf("the read key never worked: %w", err)
		}
		t0 = time.Now()
		if err := p.Revoke(ctx, claim.Name, "bob"); err != nil {
			return err
		}
		revoke = append(revoke, time.Since(t0))
		t1 := time.Now()
		if err := poll(ctx, func() bool { return denied(list(ctx, reader, claim.Name)) }); err != nil {
			return fmt.Errorf("the revoked key kept working: %w", err)
		}
		applied = append(applied, time.Since(t1))
		last, lastKey = b, k
	}
	fmt.Printf("\n%d buckets | p50 | p90 | max\n", c.n)
	for _, r := range []struct {
		what string
		d    []time.Duration
	}{{"Provision (new)", prov}, {"Provision (again)", again}, {"Grant read", grant}, {"Revoke", revoke}, {"revoke refused by the gateway after", applied}} {
		l := measure.Summarize(r.d)
		fmt.Printf("%s | %s | %s | %s\n", r.what, measure.Ms(l.P50), measure.Ms(l.P90), measure.Ms(l.Max))
	}
	baseline, err := fileServer(dir)
	if err != nil {
		return err
	}
	err = throughput(ctx, s3client.ForKey(last, lastKey), last.Name, body, c.rounds, baseline)
	fmt.Printf("weed RSS after: %s\n", rss(srv.PID()))
	return err
}

// throughput PUTs and GETs body rounds times through c, and through baseline (a loopback URL
// taking PUT and GET) when set, the sides taking turns; it prints MB/s and the ratios.
func throughput(ctx context.Context, c *s3.Client, bucket string, body []byte, rounds int, baseline *url) error {
	mb := float64(len(body)) / 1e6
	var s3put, s3get, bput, bget []float64
	for r := range rounds {
		key := fmt.Sprintf("bench-object-%d", r)
		t0 := time.Now()
		if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body)}, putOptions...); err != nil {
			return fmt.Errorf("s3 put: %w", err)
		}
		s3put = append(s3put, mb/time.Since(t0).Seconds())
		t0 = time.Now()
		out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		if err != nil {
			return fmt.Errorf("s3 get: %w", err)
		}
		n, err := io.Copy(io.Discard, out.Body)
		out.Body.Close()
		if err != nil || n != int64(len(body)) {
			return fmt.Errorf("s3 get: %d bytes, %w", n, err)
		}
		s3get = append(s3get, mb/time.Since(t0).Seconds())
		if baseline == nil {
			continue
		}
		put, get, err := baseline.putGet(ctx, key, body)
		if err != nil {
			return err
		}
		bput, bget = append(bput, mb/put.Seconds()), append(bget, mb/get.Seconds())
	}
	fmt.Printf("\n%d MiB object, %d rounds (median MB/s) | PUT | GET\n", len(body)>>20, rounds)
	fmt.Printf("S3 (weed) | %.0f | %.0f\n", measure.Median(s3put), measure.Median(s3get))
	if baseline != nil {
		fmt.Printf("plain HTTP to a synced file on loopback | %.0f | %.0f\n", measure.Median(bput), measure.Median(bget))
		fmt.Printf("ratio S3 / plain | %.2f | %.2f\n", measure.Median(s3put)/measure.Median(bput), measure.Median(s3get)/measure.Median(bget))
	}
	return nil
}

// url is the baseline file server.
type url string

// fileServer serves PUT (the body into a file under dir, synced) and GET of that file on
// loopback.
func fileServer(dir string) (*url, error) {
	files := filepath.Join(dir, "plain")
	if err := os.MkdirAll(files, 0o700); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := filepath.Join(files, filepath.Base(r.URL.Path))
		switch r.Method {
		case http.MethodPut:
			f, err := os.Create(path)
			if err == nil {
				_, err = io.Copy(f, r.Body)
				if err == nil { // weed's volume server syncs what it writes too
					err = f.Sync()
				}
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		case http.MethodGet:
			http.ServeFile(w, r, path)
		}
	}))
	u := url("http://" + ln.Addr().String())
	return &u, nil
}

func (u url) putGet(ctx context.Context, key string, body []byte) (put, get time.Duration, err error) {
	t0 := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, string(u)+"/"+key, bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("plain put: %w", err)
	}
	resp.Body.Close()
	put = time.Since(t0)
	t0 = time.Now()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, string(u)+"/"+key, nil)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		return 0, 0, fmt.Errorf("plain get: %w", err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != int64(len(body)) {
		return 0, 0, fmt.Errorf("plain get: %d bytes, %w", n, err)
	}
	return put, time.Since(t0), nil
}

func list(ctx context.Context, c *s3.Client, bucket string) error {
	_, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket)})
	return err
}

func denied(err error) bool {
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusForbidden
}

// poll calls f every 10 ms until it is true, for 30 s.
func poll(ctx context.Context, f func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !f() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

func rss(pid int) string {
	s, err := measure.ReadProcStatus(pid)
	if err != nil {
		return "?"
	}
	return measure.MiB(s.VmRSS)
}
