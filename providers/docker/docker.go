// Package docker is kloud's "docker" provider: machines are containers of a Docker daemon
// (DOCKER_HOST, else the local socket), made from a local image of the same Debian root
// filesystem local machines boot from, with real cloud-init inside run against a NoCloud seed
// kloud writes, and klient installed by cloud-init as on every machine (userdata.Render).
//
// Start reading at New and Docker.Provider (this file), then template.go (what ApplyTemplate
// does to a stack's template and the allowlist of docker_container arguments; drift.go, the
// cpus and memory_swap it writes as the Docker provider reads them back), service.go (the
// Docker API proxy terraform talks to; proxyupdate.go, its in-place updates), machine.go (start, stop, info, console log), image.go
// and network.go (the image and the machines' network), firewall.go (ingress rules between
// machines, on the network's bridge; events.go, Watch, keeps them in step with containers the
// daemon restarts on its own).
//
// # How Terraform drives it, and why it cannot get the host
//
// Templates declare machines with the community Docker Terraform provider (kreuzwerker/docker
// 4.6.0, built into the offline mirror by scripts/build-docker-provider.sh), resource
// docker_container, and nothing else of it. The Docker socket is root on the host, so terraform
// (a member's template, run as uid 65534 in its sandbox) never gets it: kloud writes the
// provider block itself (a user's `provider "docker"` block must be empty) with
// host = tcp://<kloud on loopback>/provider/docker/v1/<token>, and this package's service,
// served by kloud's process, is a filtering proxy in front of the real daemon: it forwards only
// the calls docker_container needs, only for containers labelled with the token's stack, and
// creates a container only for a machine the token lists, of kloud's image, on kloud's
// network, with kloud's entrypoint, and with none of the arguments that reach the host
// (privileged, binds, mounts, volumes, devices, capabilities added, host pid/ipc/uts/userns/
// cgroupns modes, security options, sysctls, runtimes, published ports, ...): an allowlist
// (createAllowed). ApplyTemplate refuses the same arguments in the template first
// (allowedArgs), so a member gets a clear error naming the file and line before terraform runs.
//
// # Network
//
// Machines are on a user-defined bridge network kloud creates (Options.Network, default
// "kloud-machines", subnet 10.200.64.0/24, bridge kloud-dk0), not on the host's network: on the
// host network every klient would share one port space and reach kloud's loopback-only
// services (terraformer); on the bridge each machine has its own address, kloud reaches its
// agent there, and machines reach kloud at the bridge's gateway (KloudURL), so kloud must
// listen on all interfaces. The network is kloud's: it is created when a build needs it and
// removed when the last container on it is gone (a destroy through the proxy, GC); see
// network.go.
//
// # Machines
//
// A machine's container runs /usr/local/sbin/kloud-boot (uploaded with the seed): it runs
// cloud-init's four stages on every start, in one Python process (userdata.CloudInitStages;
// per-boot modules restart the agent), then waits; SIGTERM stops it at once. Stop and start
// keep the container's writable layer. Every container carries the labels kloud_stack,
// kloud_machine, kloud_owner and kloud_instance. A template gives its machines their own user
// data with a labels block whose label is kloud_user_data (UserDataLabel, userscript.go): kloud
// merges it into the seed and drops the block.
package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/client"

	"github.com/kloud-dev/kloud/internal/atomicfile"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/providers/bridgefw"
)

// Names of the provider and of the Terraform provider it drives.
const (
	Name             = "docker"
	ResourceType     = "docker_container"
	TerraformName    = "docker"
	TerraformSource  = "kreuzwerker/docker"
	TerraformVersion = "4.6.0" // keep in step with scripts/build-docker-provider.sh
)

// Labels kloud puts on every container (and on its network and image).
const (
	LabelStack    = "kloud_stack"
	LabelMachine  = "kloud_machine"
	LabelOwner    = "kloud_owner"
	LabelInstance = "kloud_instance"
)

// Defaults.
const (
	DefaultNetwork  = "kloud-machines"
	DefaultBridge   = "kloud-dk0"
	DefaultSubnet   = "10.200.64.0/24"
	DefaultStateDir = "/var/lib/kloud/docker"
	DefaultTokenTTL = time.Hour
)

// Options configure the provider. Zero fields take the documented defaults.
type Options struct {
	// Host is the Docker daemon: unix:///path or tcp://host:port (no TLS). Default: DOCKER_HOST,
	// else unix:///var/run/docker.sock.
	Host string
	// BaseImage is the Debian root filesystem directory the machine image is imported from
	// (scripts/base-image.sh). Default: $KLOUD_BASE_IMAGE. Image, if set, is used instead.
	BaseImage string
	// Image is an image already in the daemon to run machines from (tests; a prebuilt image).
	Image string
	// Network, Bridge and Subnet of the machines' network (DefaultNetwork, DefaultBridge,
	// DefaultSubnet).
	Network string
	Bridge  string
	Subnet  netip.Prefix
	// Instance is this kloud's instance id (1-64 of [A-Za-z0-9._-]), a label on every container;
	// the service touches only this instance's containers. Default: a random id for this process.
	Instance string
	// Endpoint is kloud's URL as terraform on this host reaches it (http://127.0.0.1:<port>);
	// ApplyTemplate writes the proxy's address from it into the provider block. Required by
	// ApplyTemplate.
	Endpoint string
	// StateDir holds the service's token key (default DefaultStateDir), so a destroy after a
	// restart of kloud still works.
	StateDir string
	// TokenTTL is how long a stack's service token may create containers (DefaultTokenTTL).
	TokenTTL time.Duration
	// NoFirewall turns the machines' firewall off (firewall.go): the provider then does not
	// advertise the firewall capability. Without it, the firewall is on when it can work here.
	NoFirewall bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// Docker is the docker provider of one kloud.
type Docker struct {
	opts     Options
	host     string
	instance string
	log      *slog.Logger
	p        *provider.Provider

	cliOnce sync.Once
	cli     *client.Client
	cliErr  error

	mu    sync.Mutex
	image string // the machine image's reference, once ensured
	netOK bool
	// netLife orders the network's removal (write lock, network.go) after container creates
	// through the proxy (read lock): a build never creates a container on a network that is
	// being removed.
	netLife sync.RWMutex

	keyMu sync.Mutex
	key   []byte

	// The machines' firewall (firewall.go): nil without one, fwWhy says why.
	fw      *bridgefw.Table
	fwWhy   string
	fwMu    sync.Mutex // one rebuild or rules change at a time
	fwBuilt time.Time  // when the last rebuild listed the containers (fwMu)
	// Why kloud cannot show a machine its limits (limits.go): "" where it can; ns enters the
	// containers' mount namespaces for it.
	limitsWhy string
	ns        nsWorker
	// Snapshots (snapshot.go): the daemon's data root, or why its layers are not reachable, as
	// last asked (layersAt).
	layersMu     sync.Mutex
	layersAt     time.Time
	layersRoot   string
	layersErr    error
	layersAsking chan struct{} // closed when the question in flight is answered
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// New returns the docker provider. It fails only on options that can never work; a host
// without a reachable daemon gives a provider whose Available says why.
func New(opts Options) (*Docker, error) {
	d := &Docker{opts: opts, host: opts.Host, instance: opts.Instance, log: opts.Logger}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.host == "" {
		d.host = os.Getenv("DOCKER_HOST")
	}
	if d.host == "" {
		d.host = "unix:///var/run/docker.sock"
	}
	if _, _, err := dialTarget(d.host); err != nil {
		return nil, fmt.Errorf("docker provider: %w", err)
	}
	if d.opts.Network == "" {
		d.opts.Network = DefaultNetwork
	}
	if d.opts.Bridge == "" {
		d.opts.Bridge = DefaultBridge
	}
	if !d.opts.Subnet.IsValid() {
		d.opts.Subnet = netip.MustParsePrefix(DefaultSubnet)
	}
	d.opts.Subnet = d.opts.Subnet.Masked()
	if !d.opts.Subnet.Addr().Is4() || d.opts.Subnet.Bits() < 16 || d.opts.Subnet.Bits() > 30 {
		return nil, fmt.Errorf("docker provider: subnet %s: want IPv4 between /16 and /30", d.opts.Subnet)
	}
	if d.opts.StateDir == "" {
		d.opts.StateDir = DefaultStateDir
	}
	if d.opts.TokenTTL <= 0 {
		d.opts.TokenTTL = DefaultTokenTTL
	}
	if d.instance == "" {
		b := make([]byte, 8)
		rand.Read(b)
		d.instance = "proc-" + hex.EncodeToString(b)
	} else if !idRE.MatchString(d.instance) {
		return nil, fmt.Errorf("docker provider: instance id %q: want 1-64 characters of [A-Za-z0-9._-]", d.instance)
	}
	if d.opts.Image == "" && d.opts.BaseImage == "" {
		d.opts.BaseImage = os.Getenv("KLOUD_BASE_IMAGE")
	}
	d.p = provider.DeclareTerraform(&provider.Provider{
		Name:         Name,
		ResourceType: ResourceType,
		// kloud writes the NoCloud seed itself (an upload into the container): there is no
		// user_data argument on docker_container.
		NoCloudInit: true,
		Description: "Machines are containers of a Docker daemon (DOCKER_HOST or the local socket), booted with real cloud-init from the kloud machine image.",
		// Explicit: a machine needs its container id from the Terraform state, so the
		// derivation (which probes an empty BaseMachine) would miss the console log.
		Capabilities: []provider.Capability{provider.CapStart, provider.CapStop, provider.CapInfo, provider.CapConsoleLog, provider.CapConstraints, provider.CapResources, provider.CapTemplateRules},
		Constraints:  d.Constraints, // constraints.go
		Stack:        func(b *provider.BaseStack) (provider.Stack, error) { return &stack{d: d, b: b}, nil },
		Machine:      d.machine,
		KloudURL:     d.KloudURL,
		Available:    d.Available,
		Handler:      d.handler(),
		Inventory:    inventory{d}, // resources.go
	}, provider.TerraformProvider{Name: TerraformName, Source: TerraformSource, Types: []string{ResourceType}})
	// The machines' view of their limits, where kloud can make it (limits.go).
	if err := onThisHost(d.host); err != nil {
		d.limitsWhy = err.Error()
	} else if os.Geteuid() != 0 {
		d.limitsWhy = "kloud does not run as root"
	}
	// The firewall, where it works (firewall.go).
	if d.fwWhy = firewallUnusable(d.host); opts.NoFirewall {
		d.fwWhy = "the firewall is turned off (docker.Options.NoFirewall)"
	}
	if d.fwWhy == "" {
		d.fw = bridgefw.NewTable(d.opts.Bridge, d.opts.Subnet)
		d.fw.Log = d.log
		d.p.Capabilities = append(d.p.Capabilities, provider.CapFirewall)
	}
	d.p.MoreCaps = d.snapshotCaps // snapshot.go: provider.CapSnapshot while the daemon's layers are here
	return d, nil
}

// Provider returns the provider to register with kloud's registry.
func (d *Docker) Provider() *provider.Provider { return d.p }

// Instance is this kloud's instance id, a label on the containers it makes.
func (d *Docker) Instance() string { return d.instance }

// Host is the daemon's address.
func (d *Docker) Host() string { return d.host }

// Network is the machines' network name.
func (d *Docker) Network() string { return d.opts.Network }

// Subnet is the machines' network's subnet.
func (d *Docker) Subnet() netip.Prefix { return d.opts.Subnet }

// StateDir is where the provider keeps its service key and the machines' firewall rules.
func (d *Docker) StateDir() string { return d.opts.StateDir }

// Gateway is the network's gateway (the host's address on the bridge): where machines reach kloud.
func (d *Docker) Gateway() netip.Addr { return d.opts.Subnet.Addr().Next() }

// Client returns the Docker Engine API client of the daemon.
func (d *Docker) Client() (*client.Client, error) {
	d.cliOnce.Do(func() {
		d.cli, d.cliErr = client.New(client.WithHost(d.host), client.WithAPIVersionNegotiation())
	})
	return d.cli, d.cliErr
}

// Available reports whether the daemon answers (nil), else why not.
func (d *Docker) Available() error {
	cli, err := d.Client()
	if err != nil {
		return fmt.Errorf("docker provider: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
		return fmt.Errorf("no Docker daemon answers at %s (install docker.io and start it, or set DOCKER_HOST): %w", d.host, err)
	}
	if d.opts.Image == "" && d.opts.BaseImage == "" {
		return errors.New("docker provider: no machine image: set KLOUD_BASE_IMAGE (scripts/setup.sh as root builds it) or docker.Options.Image")
	}
	return nil
}

// KloudURL turns kloud's public URL into the one machines use: the same scheme, port and path
// on the network's gateway.
func (d *Docker) KloudURL(publicURL string) string {
	u, err := url.Parse(publicURL)
	if err != nil || u.Host == "" {
		return publicURL
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "wss": "443"}[u.Scheme]
		if port == "" {
			port = "80"
		}
	}
	u.Host = net.JoinHostPort(d.Gateway().String(), port)
	return u.String()
}

// dialTarget parses a daemon address into a network and address for net.Dial.
func dialTarget(host string) (network, addr string, err error) {
	proto, rest, ok := strings.Cut(host, "://")
	switch {
	case ok && proto == "unix" && rest != "":
		return "unix", rest, nil
	case ok && proto == "tcp" && rest != "":
		h := strings.TrimSuffix(rest, "/")
		if _, _, err := net.SplitHostPort(h); err != nil {
			return "", "", fmt.Errorf("docker host %q: %w", host, err)
		}
		return "tcp", h, nil
	}
	return "", "", fmt.Errorf("docker host %q: want unix:///path or tcp://host:port", host)
}

// onThisHost says why the daemon at host is not known to be on this host (nil if it is: reached
// through a unix socket, in kloud's mount and network namespaces); the firewall (its bridge) and
// snapshots (its storage) need it there.
func onThisHost(host string) error {
	if network, _, err := dialTarget(host); err != nil || network != "unix" {
		return fmt.Errorf("the Docker daemon is reached at %s, not through a local unix socket", host)
	}
	return nil
}

// serviceKey is the service's HMAC key (<StateDir>/.service-key, 0600), created on first use.
func (d *Docker) serviceKey() ([]byte, error) {
	d.keyMu.Lock()
	defer d.keyMu.Unlock()
	if d.key != nil {
		return d.key, nil
	}
	path := filepath.Join(d.opts.StateDir, ".service-key")
	if b, err := os.ReadFile(path); err == nil && len(b) >= 32 {
		d.key = b
		return b, nil
	}
	if err := os.MkdirAll(d.opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("docker provider: state dir: %w", err)
	}
	b := make([]byte, 32)
	rand.Read(b)
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("docker provider: service key: %w", err)
	}
	d.key = b
	return b, nil
}
