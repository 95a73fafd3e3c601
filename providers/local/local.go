// Package local is kloud's "local" provider: machines are Linux namespace machines on the kloud
// host (package sandbox). Terraform declares them (package tfprovider, resource
// kloudlocal_machine), but the kloudlocal Terraform provider runs unprivileged and only asks
// kloud: this package's local machine service (service.go), served by kloud's own process (root)
// under /provider/local/v1/, creates, retags and destroys them, for a token that ApplyTemplate
// mints for one stack (token.go). kloud starts, stops and inspects machines itself through the
// same sandbox library.
//
// Start reading at New and Local.Provider (this file), then template.go (what ApplyTemplate does
// to a stack's template), service.go and token.go (the service) and machine.go (start, stop, info,
// console log).
//
// # Wiring (kloud serve)
//
//	func main() {
//		sandbox.MaybeRunInit() // first: Machine.Start re-executes kloud as the machine's PID 1
//		...
//		l, err := local.New(local.Options{Logger: logger, Instance: id, Endpoint: "http://127.0.0.1:7000"})
//		registry.Register(l.Provider()) // kloud mounts Provider().Handler at /provider/local/
//		if l.Provider().Available() == nil {
//			l.SetupNetwork(ctx)  // the bridge, before listening on l.HostAddr()
//		l.GC(ctx, keep)      // startup sweep of this instance's machines of dead stacks
//		}
//	}
//
// Machines reach kloud at Provider().KloudURL(publicURL): the bridge address with the public
// URL's port, so kloud must listen on that port on all interfaces (or on the bridge address too).
//
// # Template rules
//
// ApplyTemplate gives every kloudlocal_machine its agent (user data rendered with
// userdata.Render, one kite key per machine), tags it with the stack and machine ids (TagStack,
// TagMachine), and writes the provider's configuration into GeneratedFile: the service's endpoint
// and the stack's token (a sensitive variable, TokenVar). A template may have a
// `provider "kloudlocal"` block only if it is empty; kloud replaces it. The base image, state dir,
// bridge and subnet are kloud's configuration (Options), never the template's.
//
// # Instances
//
// Every machine records the instance id of the kloud that made it (Options.Instance, kept in the
// kloud's data dir), so several klouds can share a host and a state dir: GC and the service touch
// only their own instance's machines.
package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/buildtoken"
	"github.com/kloud-dev/kloud/providers/local/sandbox"
	"github.com/kloud-dev/kloud/providers/local/tfprovider"
)

// Names of the provider.
const (
	Name         = "local"
	ResourceType = tfprovider.ResourceType // "kloudlocal_machine"
	UserDataAttr = "user_data"
)

// Tags kloud puts on every machine; GC and the service read them back.
const (
	TagStack   = "kloud_stack"
	TagMachine = "kloud_machine"
)

// TokenVar is the sensitive Terraform variable holding the stack's service token.
const TokenVar = "kloud_local_token"

// Options configure the provider. Zero fields take the sandbox's defaults, which are also the
// kloudlocal Terraform provider's defaults.
type Options struct {
	// StateDir holds the machines (default sandbox.DefaultStateDir).
	StateDir string
	// BaseImage new machines are created on. Default: sandbox.EnsureBaseImage under
	// $KLOUD_CACHE, resolved at the first ApplyTemplate (it builds the image if it is missing).
	BaseImage string
	// Bridge and Subnet of the machines' network (default sandbox.DefaultBridge and
	// sandbox.DefaultSubnet).
	Bridge string
	Subnet netip.Prefix
	// Instance is this kloud's instance id (1-64 of [A-Za-z0-9._-]), recorded in every machine
	// it creates; GC and the service leave machines of other instances alone. Default: a random
	// id for this process only (its machines are never swept by a later process).
	Instance string
	// Endpoint is kloud's URL as terraform on this host reaches it (http://127.0.0.1:<port> when
	// kloud listens on all interfaces); ApplyTemplate writes it into the provider block. Required
	// by ApplyTemplate.
	Endpoint string
	// TokenTTL is how long a stack's service token is valid (default DefaultTokenTTL).
	TokenTTL time.Duration
	// MachinePidsMax caps each machine's processes and threads (its pids cgroup): a fork bomb in
	// a machine gets EAGAIN, the host keeps going. 0: sandbox.DefaultPidsMax (4096); -1: none.
	MachinePidsMax int
	// Logger; nil discards.
	Logger *slog.Logger
}

// Local is the local provider of one kloud.
type Local struct {
	opts     Options
	stateDir string
	log      *slog.Logger
	m        *sandbox.Manager
	merr     error // why m is nil: sandbox.Available's answer
	p        *provider.Provider

	instance string
	tokens   *buildtoken.Keyring // the machine service's tokens (token.go)

	mu        sync.Mutex
	baseImage string
	creatorM  *sandbox.Manager // m with the base image: for Create
}

// New returns the local provider. It fails only on options that can never work (a bad bridge
// name or subnet); a host that cannot run machines (not root, iproute2 missing) gives a provider
// whose Available says why.
func New(opts Options) (*Local, error) {
	l := &Local{opts: opts, log: opts.Logger, baseImage: opts.BaseImage, instance: opts.Instance}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.instance == "" {
		b := make([]byte, 8)
		rand.Read(b)
		l.instance = "proc-" + hex.EncodeToString(b)
	} else if !idRE.MatchString(l.instance) {
		return nil, fmt.Errorf("local provider: instance id %q: want 1-64 characters of [A-Za-z0-9._-]", l.instance)
	}
	if opts.Subnet.IsValid() && (!opts.Subnet.Addr().Is4() || opts.Subnet.Bits() < 16 || opts.Subnet.Bits() > 30) {
		return nil, fmt.Errorf("local provider: subnet %s: want IPv4 between /16 and /30", opts.Subnet)
	}
	sd := opts.StateDir
	if sd == "" {
		sd = sandbox.DefaultStateDir
	}
	var err error
	if l.stateDir, err = filepath.Abs(sd); err != nil {
		return nil, fmt.Errorf("local provider: state dir: %w", err)
	}
	l.tokens = buildtoken.New(buildtoken.Options{Dir: l.stateDir, Issuer: tokenIssuer, Audience: tokenAudience, Instance: l.instance, TTL: opts.TokenTTL})
	if l.merr = sandbox.Available(); l.merr == nil {
		l.m, err = sandbox.New(sandbox.Options{
			StateDir: l.stateDir, Bridge: opts.Bridge, Subnet: opts.Subnet, Logger: l.log,
		})
		if err != nil {
			return nil, fmt.Errorf("local provider: %w", err)
		}
	}
	l.p = &provider.Provider{
		Name:         Name,
		ResourceType: ResourceType,
		UserDataAttr: UserDataAttr,
		Description:  "Machines on this host: Linux namespaces over a Debian root filesystem, booted with real cloud-init (needs root).",
		// Explicit: a machine needs its id from the Terraform state, so the derivation (which
		// probes an empty BaseMachine) would miss the console log.
		Capabilities: []provider.Capability{provider.CapStart, provider.CapStop, provider.CapInfo, provider.CapConsoleLog, provider.CapTemplateRules,
			provider.CapSnapshot,    // snapshot.go
			provider.CapConstraints, // constraints.go
			provider.CapFirewall,    // firewall.go
			provider.CapResources,   // resources.go
		},
		Constraints: l.Constraints, // constraints.go
		Stack:       func(b *provider.BaseStack) (provider.Stack, error) { return l.newStack(b), nil },
		Machine:     l.machine,
		KloudURL:    l.KloudURL,
		Available:   l.Available,
		Handler:     l.handler(),
		Inventory:   inventory{l}, // resources.go
	}
	return l, nil
}

// Provider returns the provider to register with kloud's registry.
func (l *Local) Provider() *provider.Provider { return l.p }

// Available reports whether local machines can run on this host (nil), else why not.
func (l *Local) Available() error {
	if err := sandbox.Available(); err != nil {
		return err
	}
	return l.merr
}

// manager returns the machine library, or why there is none.
func (l *Local) manager() (*sandbox.Manager, error) {
	if l.m == nil {
		return nil, fmt.Errorf("local provider unavailable: %w", l.merr)
	}
	return l.m, nil
}

// Instance is this kloud's instance id, recorded in the machines it creates.
func (l *Local) Instance() string { return l.instance }

// StateDir is the machines' directory (absolute). StateDir, Bridge and Subnet give the
// effective settings, defaults filled in.
func (l *Local) StateDir() string { return l.stateDir }

// Bridge is the bridge's name.
func (l *Local) Bridge() string {
	if l.opts.Bridge != "" {
		return l.opts.Bridge
	}
	return sandbox.DefaultBridge
}

// Subnet is the bridge's subnet.
func (l *Local) Subnet() netip.Prefix {
	if l.opts.Subnet.IsValid() {
		return l.opts.Subnet.Masked()
	}
	return netip.MustParsePrefix(sandbox.DefaultSubnet)
}

// HostAddr is the bridge address: where machines reach kloud.
func (l *Local) HostAddr() netip.Addr { return l.Subnet().Addr().Next() }

// SetupNetwork creates the bridge (idempotent). Call it before listening on HostAddr; kloud
// listening on all interfaces does not need it (the first machine creates the bridge).
func (l *Local) SetupNetwork(ctx context.Context) error {
	m, err := l.manager()
	if err != nil {
		return err
	}
	return m.SetupNetwork(ctx)
}

// KloudURL turns kloud's public URL into the one machines use: the same scheme, port and path
// on the bridge address. A URL without a port keeps the scheme's default port.
func (l *Local) KloudURL(publicURL string) string {
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
	u.Host = net.JoinHostPort(l.HostAddr().String(), port)
	return u.String()
}

// baseImagePath returns Options.BaseImage, else the cached base image (built if missing).
func (l *Local) baseImagePath(ctx context.Context) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.baseImage != "" {
		return l.baseImage, nil
	}
	p, err := sandbox.EnsureBaseImage(ctx, "", l.log)
	if err != nil {
		return "", err
	}
	l.baseImage = p
	return p, nil
}

// creator returns the machine library with the base image set, for Create.
func (l *Local) creator(ctx context.Context) (*sandbox.Manager, error) {
	if _, err := l.manager(); err != nil {
		return nil, err
	}
	base, err := l.baseImagePath(ctx)
	if err != nil {
		return nil, fmt.Errorf("local machines' base image: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.creatorM == nil {
		m, err := sandbox.New(sandbox.Options{
			StateDir: l.stateDir, BaseImage: base, Bridge: l.opts.Bridge, Subnet: l.opts.Subnet, Logger: l.log,
			PidsMax: l.opts.MachinePidsMax,
		})
		if err != nil {
			return nil, err
		}
		l.creatorM = m
	}
	return l.creatorM, nil
}

// GC destroys this instance's machines whose stack or machine kloud no longer has (keep returns
// false for their ids), machines a crash left half-created, and network leftovers no machine
// owns. It never removes machines of another kloud instance, nor machines without kloud's tags
// (made by someone else). Machines without an instance id (made before kloud recorded one) are
// kept too: they may be another kloud's on a shared state dir. Those whose stack and machine keep
// knows are adopted (recorded as this instance's), so later sweeps look after them; the others
// are logged. It returns the ids of the machines it destroyed.
func (l *Local) GC(ctx context.Context, keep func(stackID, machineID string) bool) ([]string, error) {
	m, err := l.manager()
	if err != nil {
		return nil, err
	}
	var adopt []string
	removed, err := m.GC(ctx, func(in sandbox.Info) bool {
		s, mid := in.Tags[TagStack], in.Tags[TagMachine]
		switch {
		case s == "" && mid == "":
			return true
		case in.Instance == "":
			if keep(s, mid) {
				adopt = append(adopt, in.ID)
			} else {
				l.log.Warn("local provider: keeping a machine of an unknown stack without an instance id (it may be another kloud's); destroy it by hand if it is garbage",
					"machine", in.ID, "stack", s, "dir", in.Dir)
			}
			return true
		case in.Instance != l.instance:
			return true
		}
		return keep(s, mid)
	})
	for _, id := range adopt {
		if _, aerr := m.SetInstance(ctx, id, l.instance); aerr != nil {
			l.log.Warn("local provider: adopt machine", "machine", id, "err", aerr)
		}
	}
	return removed, err
}
