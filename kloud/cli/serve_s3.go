package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kloud-dev/kloud/objstore/seaweed"
	"github.com/kloud-dev/kloud/provider"
)

// EnvWeed names the weed binary kloud serve starts as its S3 server when --weed-bin is not given
// (scripts/setup.sh writes it into the cache's env, which `make run` reads).
const EnvWeed = "KLOUD_WEED"

// serveS3 is kloud serve's S3 server for stacks' buckets (docs/buckets.md): SeaweedFS's weed,
// started and supervised like terraformer (restarted with backoff, stopped with kloud), its data
// under <data dir>/s3 and its log lines through kloud's log with "weed: " before them. Its master,
// volume server and filer listen on loopback only, in a network namespace of their own when kloud
// runs as root (seaweed.Options.Isolate: out of reach of plugins and terraform); its S3 gateway (which checks every request's
// key) listens where kloud does, so that local machines reach it on their bridge. With --s3-url
// kloud starts nothing and provisions on that SeaweedFS instead. The local provider's stacks get
// the provisioner (Provider.Buckets): their templates may claim buckets (kloud_bucket).
type serveS3 struct {
	mode    string // --s3: auto, off
	weedBin string
	port    int
	url     string // --s3-url: an external SeaweedFS's S3 endpoint
	master  string // --s3-master: its master, host:port.grpcPort
	filer   string
	access  string
	secretF string                      // --s3-secret-key-file
	srv     *seaweed.Server             // the server kloud started
	popts   *seaweed.ProvisionerOptions // --s3-url: the external server's provisioner
	prov    *seaweed.Provisioner
}

// weed is the weed binary of --weed-bin, else $KLOUD_WEED ("" if neither is set).
func (s3 *serveS3) weed() string {
	if s3.weedBin != "" {
		return s3.weedBin
	}
	return os.Getenv(EnvWeed)
}

func (s3 *serveS3) flags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&s3.mode, "s3", "auto", "S3 server for stacks' buckets: auto (start SeaweedFS's weed from --weed-bin when there is one; without it templates cannot claim buckets) or off")
	fl.StringVar(&s3.weedBin, "weed-bin", "", "SeaweedFS weed binary kloud starts as its S3 server (default $"+EnvWeed+", else weed next to this binary)")
	fl.IntVar(&s3.port, "s3-port", 0, "port of the S3 server kloud starts, on the host of --addr (0: a free one, kept across restarts)")
	fl.StringVar(&s3.url, "s3-url", "", "provision buckets on this SeaweedFS S3 endpoint instead of starting one (with --s3-master, --s3-access-key and --s3-secret-key-file)")
	fl.StringVar(&s3.master, "s3-master", "", "that SeaweedFS's master as weed shell takes it, host:port.grpcPort (e.g. 10.0.0.5:9333.19333)")
	fl.StringVar(&s3.filer, "s3-filer", "", "that SeaweedFS's filer, host:port.grpcPort (optional; saves weed shell a lookup)")
	fl.StringVar(&s3.access, "s3-access-key", "", "an access key with the Admin action on that SeaweedFS")
	fl.StringVar(&s3.secretF, "s3-secret-key-file", "", "file holding that key's secret")
}

// start starts the S3 server (or sets up the external one's provisioner) before the providers
// register. Without a weed binary (auto) it logs why buckets are off and returns nil: kloud runs
// without them. The server stops when ctx ends (runServe's defer calls stop too).
func (s3 *serveS3) start(ctx context.Context, f *serveFlags, log *slog.Logger, out io.Writer) error {
	switch {
	case s3.mode == "off":
		if s3.url != "" {
			return errors.New("--s3 off and --s3-url: choose one")
		}
		return nil
	case s3.mode != "auto":
		return fmt.Errorf("--s3 %q: want auto or off", s3.mode)
	case s3.url != "":
		return s3.external(log)
	}
	bin := s3.weed()
	if bin == "" {
		if exe, err := os.Executable(); err == nil {
			bin = filepath.Join(filepath.Dir(exe), "weed")
		}
	}
	if _, err := os.Stat(bin); err != nil || bin == "" {
		log.Warn("buckets are off: no S3 server to start (build SeaweedFS's weed with scripts/build-seaweedfs.sh and pass --weed-bin, or set $"+EnvWeed+")", "weedBin", bin)
		return nil
	}
	host, _, err := net.SplitHostPort(f.o.Addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w", f.o.Addr, err)
	}
	s3IP := host
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		s3IP = "0.0.0.0"
	}
	// weed's master, volume server and filer take no keys: in a network namespace of their own
	// no other process of this host (plugins, terraform) reaches them. That needs root.
	isolate := os.Geteuid() == 0
	for _, tool := range []string{"unshare", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			isolate = false
		}
	}
	if !isolate {
		log.Warn("s3 server: not isolated (needs root, unshare, nsenter and ip): its master, volume server and filer, which take no keys, answer every process of this host on loopback")
	}
	srv, err := seaweed.Start(ctx, seaweed.Options{
		Bin: bin, Dir: filepath.Join(f.o.DataDir, "s3"), S3IP: s3IP, S3Port: s3.port, Isolate: isolate,
		Log: log.With("component", "s3"), Out: out,
	})
	if err != nil {
		return fmt.Errorf("s3 server: %w (--s3 off runs kloud without buckets)", err)
	}
	s3.srv = srv
	log.Info("s3 server started", "endpoint", srv.Endpoint(), "pid", srv.PID(), "dir", srv.Dir())
	return nil
}

// external sets up the provisioner of a SeaweedFS kloud did not start.
func (s3 *serveS3) external(log *slog.Logger) error {
	if s3.master == "" || s3.access == "" || s3.secretF == "" {
		return errors.New("--s3-url needs --s3-master, --s3-access-key and --s3-secret-key-file")
	}
	secret, err := os.ReadFile(s3.secretF)
	if err != nil {
		return fmt.Errorf("--s3-secret-key-file: %w", err)
	}
	bin := s3.weed()
	if bin == "" {
		return errors.New("--s3-url: weed shell grants keys there: pass --weed-bin (or set $" + EnvWeed + ")")
	}
	log.Info("buckets on an external SeaweedFS", "endpoint", s3.url, "master", s3.master)
	s3.popts = &seaweed.ProvisionerOptions{
		Endpoint: s3.url, Master: s3.master, Filer: s3.filer, Weed: bin,
		AdminAccessKey: s3.access, AdminSecretKey: strings.TrimSpace(string(secret)),
	}
	return nil
}

// provisioner returns the buckets provisioner of the machines that reach the S3 server at
// publicEndpoint(the server's URL) (nil: buckets are off). There is one per kloud, made at the
// first call: the first provider to ask fixes the endpoint in its buckets. (A started server's
// provisioners share its lock: weed shell's configuration is read, changed and written whole.)
func (s3 *serveS3) provisioner(instance string, publicEndpoint func(string) string, log *slog.Logger) provider.BucketProvisioner {
	if s3.prov != nil {
		return s3.prov
	}
	log = log.With("component", "buckets")
	switch {
	case s3.srv != nil:
		pub := s3.srv.Endpoint()
		if publicEndpoint != nil {
			pub = publicEndpoint(pub)
		}
		s3.prov = s3.srv.ProvisionerAt(instance, pub, log)
	case s3.popts != nil: // an external server's URL is the same for all
		o := *s3.popts
		o.Instance, o.Log = instance, log
		p, err := seaweed.NewProvisioner(o)
		if err != nil { // every required option is set (external)
			log.Error("buckets are off", "err", err)
			return nil
		}
		s3.prov = p
	default:
		return nil
	}
	return s3.prov
}

// stop stops the server kloud started.
func (s3 *serveS3) stop() {
	if s3.srv != nil {
		s3.srv.Stop()
	}
}

// glogFilter passes on the lines of weed's log (glog's format: the severity letter first) that
// are warnings, errors or fatal: its info lines (a few for every start, bucket and key) stay out
// of kloud's log.
type glogFilter struct{ w io.Writer }

func (f glogFilter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" && strings.IndexByte("WEF", line[0]) >= 0 {
			io.WriteString(f.w, line)
		}
	}
	return len(b), nil
}
