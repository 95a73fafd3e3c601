// Package seaweed runs SeaweedFS's `weed` (Apache-2.0) as kloud's S3 server and provisions
// object buckets on it: a Provisioner implements provider.BucketProvisioner with the S3 API (the
// admin key makes, tags and deletes buckets) and `weed shell`'s s3.configure (one identity per
// bucket and user, with per-bucket actions, which the S3 gateway enforces).
//
// Start reading at Start (the supervised server, server.go), then Provisioner (provisioner.go).
// NewProvisioner is the same provisioner for a SeaweedFS kloud did not start (--s3-url).
// docs/buckets.md "The S3 server" says which flags, files and ports it uses and why.
package seaweed

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kloud-dev/kloud/internal/atomicfile"
	"github.com/kloud-dev/kloud/internal/supervise"
	"github.com/kloud-dev/kloud/objstore/s3client"
)

// Options configure Start.
type Options struct {
	// Bin is the weed binary (required; scripts/build-seaweedfs.sh builds it).
	Bin string
	// Dir holds its data, configuration and admin key (required; created, mode 0700).
	Dir string
	// IP is the address it binds and announces (default 127.0.0.1).
	IP string
	// S3IP is the address only its S3 gateway binds (default IP): kloud serve binds it where
	// machines reach kloud ("0.0.0.0" for all), while the master, volume server and filer, which
	// take no keys, stay on IP.
	S3IP string
	// Isolate runs weed in a network namespace of its own (needs root; unshare and ip): its
	// master, volume server and filer, which take no keys, are then out of reach of every other
	// process of the host, sandboxed plugins and terraform included, not only of other hosts;
	// the S3 gateway is reached through a forwarder on S3IP:S3Port to its unix socket under Dir.
	// weed shell (the Provisioner's) runs in that namespace too (nsenter).
	Isolate bool
	// Ports; 0 picks a free one (reused from Dir/ports.json on the next start when still free).
	S3Port, MasterPort, VolumePort, FilerPort int
	// PublicEndpoint is the S3 URL clients (machines) use (default http://IP:S3Port).
	PublicEndpoint string
	// Log gets the supervisor's messages (nil: discarded); Out gets weed's own log lines
	// (nil: discarded).
	Log *slog.Logger
	Out io.Writer
	// QuotaInterval is how often bucket quotas are enforced (default 30 s; SeaweedFS makes a
	// bucket over its quota read-only only when told to: `s3.bucket.quota.enforce -apply`).
	QuotaInterval time.Duration
	// MemoryLimitMB is weed's Go memory limit (GOMEMLIMIT; default 512, < 0: none). weed holds
	// on to what large transfers allocated: about 145 MiB resident idle, 500-560 MiB after a
	// 64 MiB object went through without a limit, about 380 MiB with 512 (bench/buckets).
	MemoryLimitMB int
}

// Server is a running, supervised weed server: master, volume server, filer and S3 gateway in
// one process. Its gRPC ports are its HTTP ports + 1.
type Server struct {
	o        Options
	ports    ports
	admin    adminKey
	sup      *supervise.Process
	endpoint string
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	// mu serializes the calls of every Provisioner of this server.
	mu  sync.Mutex
	fwd *forwarder // Isolate: S3IP:S3Port to weed's S3 socket (forward.go)
}

// ports are a server's HTTP ports; each service's gRPC port is its HTTP port + 1.
type ports struct {
	S3     int `json:"s3"`
	Master int `json:"master"`
	Volume int `json:"volume"`
	Filer  int `json:"filer"`
}

// adminKey is the admin identity's key, kept in Dir/admin.json (0600).
type adminKey struct {
	AccessKey string `json:"accessKey"`
	SecretKey string `json:"secretKey"`
}

// Start runs weed server under Dir and returns once its S3 gateway takes writes (the admin
// key writes an object to HealthBucket). It is supervised (internal/supervise): restarted with backoff
// when it exits, until Stop. Free ports (an option 0) are picked here; a clash at the first start
// picks others (three tries).
func Start(ctx context.Context, o Options) (*Server, error) {
	if o.Bin == "" || o.Dir == "" {
		return nil, errors.New("seaweed: Options.Bin and Options.Dir are required")
	}
	if o.IP == "" {
		o.IP = "127.0.0.1"
	}
	if o.S3IP == "" {
		o.S3IP = o.IP
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.QuotaInterval <= 0 {
		o.QuotaInterval = 30 * time.Second
	}
	if o.MemoryLimitMB == 0 {
		o.MemoryLimitMB = 512
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("seaweed: %w", err)
	}
	o.Dir = dir
	for _, d := range []string{o.Dir, o.path("data"), o.path("master"), o.path("tmp"), o.path("log")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("seaweed: %w", err)
		}
	}
	s := &Server{o: o}
	if s.admin, err = loadAdminKey(o.path("admin.json")); err != nil {
		return nil, err
	}
	if err := s.writeConfig(); err != nil {
		return nil, err
	}
	for try := 1; ; try++ {
		if s.ports, err = o.pickPorts(); err != nil {
			return nil, err
		}
		err = s.start(ctx)
		if err == nil {
			break
		}
		if try == 3 || !o.freePorts() || !(strings.Contains(err.Error(), "exited at start") || strings.Contains(err.Error(), "the S3 address")) {
			return nil, err
		}
		o.Log.Warn("weed did not start; trying other ports", "err", err, "try", try)
	}
	if o.freePorts() {
		if b, err := json.Marshal(s.ports); err == nil {
			atomicfile.WriteFile(o.path("ports.json"), b, 0o600)
		}
	}
	qctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go s.enforceQuotas(qctx)
	return s, nil
}

func (o *Options) path(name string) string { return filepath.Join(o.Dir, name) }

// freePorts reports whether any port is picked by Start.
func (o *Options) freePorts() bool {
	return o.S3Port == 0 || o.MasterPort == 0 || o.VolumePort == 0 || o.FilerPort == 0
}

// pickPorts returns the options' ports, the zero ones picked: those of Dir/ports.json if they
// (and their gRPC ports) are free, else free ones.
func (o *Options) pickPorts() (ports, error) {
	p := ports{S3: o.S3Port, Master: o.MasterPort, Volume: o.VolumePort, Filer: o.FilerPort}
	if !o.freePorts() {
		return p, nil
	}
	var old ports
	if b, err := os.ReadFile(o.path("ports.json")); err == nil && json.Unmarshal(b, &old) == nil {
		for _, f := range []struct{ p, old *int }{{&p.S3, &old.S3}, {&p.Master, &old.Master}, {&p.Volume, &old.Volume}, {&p.Filer, &old.Filer}} {
			if *f.p == 0 && *f.old > 0 && o.portFree(*f.old) && o.portFree(*f.old+1) {
				*f.p = *f.old
			}
		}
	}
	for _, f := range []*int{&p.S3, &p.Master, &p.Volume, &p.Filer} {
		for tries := 0; *f == 0; tries++ {
			if tries == 100 {
				return p, errors.New("seaweed: no two adjacent free ports")
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(o.IP, "0"))
			if err != nil {
				return p, fmt.Errorf("seaweed: pick a port: %w", err)
			}
			port := ln.Addr().(*net.TCPAddr).Port
			ln.Close()
			taken := port == p.S3 || port == p.Master || port == p.Volume || port == p.Filer ||
				port+1 == p.S3 || port+1 == p.Master || port+1 == p.Volume || port+1 == p.Filer ||
				port == p.S3+1 || port == p.Master+1 || port == p.Volume+1 || port == p.Filer+1
			if port < 65535 && !taken && o.portFree(port+1) {
				*f = port
			}
		}
	}
	return p, nil
}

func (o *Options) portFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(o.IP, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// loadAdminKey reads the admin key at path, or makes one and writes it there (0600).
func loadAdminKey(path string) (adminKey, error) {
	var k adminKey
	b, err := os.ReadFile(path)
	if err == nil {
		if err := json.Unmarshal(b, &k); err != nil || k.AccessKey == "" || k.SecretKey == "" {
			return k, fmt.Errorf("seaweed: admin key %s: unreadable or empty (remove it to make a new one)", path)
		}
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return k, fmt.Errorf("seaweed: admin key: %w", err)
	}
	k = adminKey{AccessKey: "KA" + randomKey(18, true), SecretKey: randomKey(40, false)}
	b, _ = json.MarshalIndent(k, "", "  ")
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return k, fmt.Errorf("seaweed: admin key: %w", err)
	}
	return k, nil
}

// randomKey returns n random characters: upper-case letters and digits for an access key,
// base64's alphabet for a secret.
func randomKey(n int, upper bool) string {
	if upper {
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
		b := make([]byte, n)
		rand.Read(b)
		for i := range b {
			b[i] = alphabet[int(b[i])%len(alphabet)]
		}
		return string(b)
	}
	b := make([]byte, n)
	rand.Read(b)
	return base64.RawStdEncoding.EncodeToString(b)[:n]
}

// writeConfig writes the S3 gateway's static identities (the admin) and master.toml.
func (s *Server) writeConfig() error {
	cfg := map[string]any{"identities": []any{map[string]any{
		"name":        "kloud-admin",
		"credentials": []any{map[string]string{"accessKey": s.admin.AccessKey, "secretKey": s.admin.SecretKey}},
		"actions":     []string{"Admin", "Read", "List", "Tagging", "Write"},
	}}}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err := atomicfile.WriteFile(s.o.path("s3.json"), b, 0o600); err != nil {
		return fmt.Errorf("seaweed: s3 config: %w", err)
	}
	// One volume per collection (bucket) at a time, not seven: a small server with many
	// buckets would otherwise run out of volume slots, and each volume costs memory.
	const masterToml = `# written by kloud (objstore/seaweed) at every start
[master.volume_growth]
copy_1 = 1
copy_other = 1
allocation_deferral = "0s"
`
	if err := atomicfile.WriteFile(s.o.path("master.toml"), []byte(masterToml), 0o600); err != nil {
		return fmt.Errorf("seaweed: master.toml: %w", err)
	}
	return nil
}

// args are weed's command line.
func (s *Server) args() []string {
	p, o := s.ports, s.o
	itoa := strconv.Itoa
	return []string{
		"-logtostderr", "-logdir=" + o.path("log"), "-config_dir=" + o.Dir,
		"server", "-dir=" + o.path("data"), "-master.dir=" + o.path("master"),
		"-ip=" + o.IP, "-ip.bind=" + o.IP,
		"-master.port=" + itoa(p.Master), "-master.port.grpc=" + itoa(p.Master+1),
		"-volume.port=" + itoa(p.Volume), "-volume.port.grpc=" + itoa(p.Volume+1),
		"-filer.port=" + itoa(p.Filer), "-filer.port.grpc=" + itoa(p.Filer+1),
		"-s3", "-s3.ip.bind=" + s.s3Bind(), "-s3.port=" + itoa(p.S3), "-s3.port.grpc=" + itoa(p.S3+1),
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.config=" + o.path("s3.json"),
		"-s3.autoCreateBucket=false",
		"-filer.localSocket=" + o.path("filer.sock"), "-s3.localSocket=" + o.path("s3.sock"),
		"-master.telemetry=false", "-master.electionTimeout=2s",
		"-master.volumeSizeLimitMB=1024", "-volume.max=0", "-volume.preStopSeconds=0",
	}
}

// s3Bind is where weed's S3 gateway listens: S3IP, or loopback in its own namespace (Isolate:
// the forwarder listens on S3IP).
func (s *Server) s3Bind() string {
	if s.o.Isolate {
		return "127.0.0.1"
	}
	return s.o.S3IP
}

// start starts the supervised process on s.ports.
func (s *Server) start(ctx context.Context) error {
	host := s.o.S3IP
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = s.o.IP // bound to every address: reached on loopback
	}
	s.endpoint = "http://" + net.JoinHostPort(host, strconv.Itoa(s.ports.S3))
	env := append(os.Environ(), "TMPDIR="+s.o.path("tmp"), "HOME="+s.o.Dir)
	if s.o.MemoryLimitMB > 0 {
		env = append(env, fmt.Sprintf("GOMEMLIMIT=%dMiB", s.o.MemoryLimitMB))
	}
	bin, args := s.o.Bin, s.args()
	if s.o.Isolate {
		// The same process all along (unshare and sh exec), so the supervisor's pid, signals and
		// Pdeathsig are weed's; its network namespace ends with it.
		bin, args = "unshare", append([]string{"--net", "--", "sh", "-c", `ip link set lo up && exec "$0" "$@"`, s.o.Bin}, args...)
		if err := s.listen(); err != nil {
			return err
		}
	}
	s.sup = &supervise.Process{
		Name: "weed", Bin: bin, Args: args, Env: env, Dir: s.o.Dir,
		URL: s.endpoint, Health: s.healthy, Out: s.o.Out, Log: s.o.Log,
		// weed's own SIGTERM takes 15 s: its filer waits to flush a log to the volume server
		// it stopped first. Nothing is lost by not waiting: its stores journal every write.
		StopGrace: 5 * time.Second,
		// weed server puts its gRPC sockets in /tmp, whatever TMPDIR says: remove them when it
		// has exited (it does so itself only when it stops cleanly).
		OnDown:       func(error) { s.removeSockets() },
		OnUp:         s.writePID,
		StartTimeout: 60 * time.Second,
	}
	if err := s.sup.Start(ctx); err != nil {
		s.removeSockets()
		s.closeForwarder()
		return fmt.Errorf("seaweed: %w", err)
	}
	s.writePID()
	return nil
}

// writePID writes the running weed's pid to Dir/weed.pid.
func (s *Server) writePID() {
	os.WriteFile(s.o.path("weed.pid"), []byte(strconv.Itoa(s.sup.PID())+"\n"), 0o600)
}

// Sockets are the unix sockets weed server makes in /tmp for its gRPC ports (whatever TMPDIR
// says); Server removes them whenever weed has exited.
func (s *Server) Sockets() []string {
	var out []string
	for _, svc := range []struct {
		name string
		port int
	}{{"master", s.ports.Master}, {"volume", s.ports.Volume}, {"filer", s.ports.Filer}, {"s3", s.ports.S3}} {
		out = append(out, fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", svc.name, svc.port+1))
	}
	return out
}

func (s *Server) removeSockets() {
	for _, p := range s.Sockets() {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(p)
		}
	}
}

// HealthBucket is the bucket Server writes to while weed starts (Provision refuses its name).
const HealthBucket = "kloud-weed-health"

// healthy: the volume server is up and the admin key writes an object. A write, not just an
// answer: weed's filer joins the cluster (and object writes get their lock server) only 3 to 10
// s after the S3 gateway answers.
func (s *Server) healthy(ctx context.Context) bool {
	if !s.o.Isolate && !s.volumeUp(ctx) { // isolated, the volume server is out of reach: the write says it all
		return false
	}
	return s.writes(ctx)
}

// volumeUp: the volume server answers /status.
func (s *Server) volumeUp(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(s.o.IP, strconv.Itoa(s.ports.Volume))+"/status", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// writes: the admin key writes an object.
func (s *Server) writes(ctx context.Context) bool {
	c := s.adminClient()
	if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(HealthBucket)}); err != nil {
		if code := s3client.ErrorCode(err); code != "BucketAlreadyOwnedByYou" && code != "BucketAlreadyExists" {
			s.o.Log.Debug("weed not ready", "err", err)
			return false
		}
	}
	// A key of its own each time: weed locks a key while writing it, and a write given up on
	// (the probe's 2 s) would hold up the next one.
	key := aws.String("probe-" + strconv.FormatInt(time.Now().UnixNano(), 36))
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(HealthBucket), Key: key, Body: strings.NewReader("ok")}); err != nil {
		s.o.Log.Debug("weed not ready", "err", err)
		return false
	}
	c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(HealthBucket), Key: key})
	return true
}

// Stop stops quota enforcement and the server (SIGTERM; SIGKILL after 5 s) and waits.
func (s *Server) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	s.sup.Stop()
	s.removeSockets()
	s.closeForwarder()
}

// Endpoint is the S3 URL on IP (http://IP:S3Port).
func (s *Server) Endpoint() string { return s.endpoint }

// Netns is the network namespace weed runs in (/proc/PID/ns/net), "" when it is not isolated
// or not running.
func (s *Server) Netns() string {
	if !s.o.Isolate {
		return ""
	}
	if pid := s.sup.PID(); pid != 0 {
		return fmt.Sprintf("/proc/%d/ns/net", pid)
	}
	return ""
}

// PID is the running weed's pid (0 while it is down).
func (s *Server) PID() int { return s.sup.PID() }

// Dir is the server's directory (Options.Dir, absolute).
func (s *Server) Dir() string { return s.o.Dir }

// Master is the master's address as weed shell takes it: host:port.grpcPort.
func (s *Server) Master() string {
	return fmt.Sprintf("%s:%d.%d", s.o.IP, s.ports.Master, s.ports.Master+1)
}

// Filer is the filer's address as weed shell takes it: host:port.grpcPort.
func (s *Server) Filer() string {
	return fmt.Sprintf("%s:%d.%d", s.o.IP, s.ports.Filer, s.ports.Filer+1)
}

// AdminKey returns the admin identity's key (every action on every bucket).
func (s *Server) AdminKey() (accessKey, secretKey string) {
	return s.admin.AccessKey, s.admin.SecretKey
}

// Provisioner returns a provisioner of this server's buckets tagging them with instance (the
// kloud instance: provider.TagInstance), whose buckets name Options.PublicEndpoint.
func (s *Server) Provisioner(instance string) *Provisioner {
	return s.ProvisionerAt(instance, s.o.PublicEndpoint, s.o.Log)
}

// ProvisionerAt is Provisioner with the endpoint its buckets name (what the machines of a
// provider reach the server at; "": Endpoint) and the logger of its calls. Every provisioner of
// a server shares one lock with the others and with quota enforcement.
func (s *Server) ProvisionerAt(instance, publicEndpoint string, log *slog.Logger) *Provisioner {
	o := ProvisionerOptions{
		Endpoint: s.endpoint, PublicEndpoint: publicEndpoint, Master: s.Master(), Filer: s.Filer(), Weed: s.o.Bin,
		AdminAccessKey: s.admin.AccessKey, AdminSecretKey: s.admin.SecretKey, Instance: instance,
		Log: log, ShellDir: s.o.path("tmp"),
	}
	if s.o.Isolate { // not isolated, weed shell runs in kloud's namespace (Netns "" would say weed is down)
		o.Netns = s.Netns
	}
	p, err := NewProvisioner(o)
	if err != nil {
		panic(err) // every option is set
	}
	p.mu = &s.mu
	return p
}

// enforceQuotas runs `s3.bucket.quota.enforce -apply` every QuotaInterval: buckets over their
// quota become read-only, back under it writable.
func (s *Server) enforceQuotas(ctx context.Context) {
	defer s.wg.Done()
	p := s.Provisioner("")
	t := time.NewTicker(s.o.QuotaInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.sup.PID() == 0 {
			continue
		}
		if err := p.EnforceQuotas(ctx); err != nil && ctx.Err() == nil {
			s.o.Log.Warn("bucket quotas not enforced", "err", err)
		}
	}
}

func (s *Server) adminClient() *s3.Client {
	return s3client.New(s.endpoint, "", s.admin.AccessKey, s.admin.SecretKey)
}
