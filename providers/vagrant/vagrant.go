// Package vagrant is kloud's "vagrant" provider, Koding's way: machines are Vagrant machines on
// the stack owner's own host, where the owner runs `klient --vagrant` (package klient,
// vagranthost.go). kloud never runs Vagrant itself: it calls that host klient's vagrant.*
// methods over kite, through the connection the host klient registered with kontrol. Terraform
// declares the machines (package tfprovider, resource kloudvagrant_machine); the kloudvagrant
// Terraform provider runs unprivileged and only asks kloud's vagrant machine service
// (service.go, under /provider/vagrant/v1/), which creates, retags and destroys machines on the
// owner's host for a token that ApplyTemplate mints for one stack build (token.go). kloud starts,
// stops and inspects machines through the same host (machine.go).
//
// Start reading at New and Vagrant.Provider (this file), then template.go (what ApplyTemplate
// does to a template: the agent's user data, kloud's tags, the provider block), service.go and
// records.go (which machine is whose), machine.go (start, stop, info), hosts.go (finding the
// owner's host klient through kontrol). Optional capabilities: constraints.go (cpus and memory
// checked against the owner's host's vagrant.info), snapshot.go (kept on the host),
// resources.go (kloud's gc). No firewall: the machines share their host's network
// (docs/providers.md says why).
//
// # Which host
//
// A host klient registers with its owner's kite key under the kite name
// kontrolapi.VagrantHostName; kontrol refuses that name to machines' agent keys, so a kite of
// that name and owner is the owner's host. A new machine goes to the owner's host (the first by
// kite id when there are several); its record keeps that host's kite id, and every later
// operation on the machine goes to that host only.
//
// # The machines' agents
//
// ApplyTemplate renders every machine's cloud-init with userdata.Render (as for every provider);
// the host klient writes it as the machine's NoCloud seed, and the machine's own klient
// registers from there. With Vagrant's docker provider a machine has the host's network, so it
// reaches kloud at the URL the host does.
package vagrant

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/buildtoken"
	"github.com/kloud-dev/kloud/providers/vagrant/tfprovider"
)

// Names of the provider.
const (
	Name         = "vagrant"
	ResourceType = tfprovider.ResourceType // "kloudvagrant_machine"
	UserDataAttr = "user_data"
)

// Tags kloud puts on every machine (the same as the local provider's).
const (
	TagStack   = "kloud_stack"
	TagMachine = "kloud_machine"
)

// TokenVar is the sensitive Terraform variable holding the stack's service token.
const TokenVar = "kloud_vagrant_token"

// Hosts finds a user's vagrant host klient (hosts.go: KontrolHosts).
type Hosts interface {
	// Host returns a connection to owner's vagrant host with kite id want (any of the owner's
	// hosts when want is empty) and a token of owner for it. No such host connected: an error
	// wrapping kite.ErrUnavailable that says how to start one.
	Host(ctx context.Context, owner, want string) (*Host, error)
}

// Host is a connected vagrant host.
type Host struct {
	KiteID string
	Conn   *kite.Conn
	Token  string // a kite token of the owner for this host
}

// Options configure the provider.
type Options struct {
	// StateDir keeps the service's key and the machines' records (required; kloud serve uses
	// <data dir>/vagrant).
	StateDir string
	// Hosts finds the owners' vagrant hosts (required; kloud serve passes KontrolHosts).
	Hosts Hosts
	// Instance is this kloud's instance id, recorded with every machine (default: random).
	Instance string
	// Endpoint is kloud's URL as terraform on this host reaches it; ApplyTemplate writes it into
	// the provider block. Required by ApplyTemplate.
	Endpoint string
	// TokenTTL is how long a stack's service token is valid (default DefaultTokenTTL).
	TokenTTL time.Duration
	// OpTimeout bounds one vagrant.* call on a host (default 10 minutes: a first `vagrant up`
	// may pull a box).
	OpTimeout time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// Vagrant is the vagrant provider of one kloud.
type Vagrant struct {
	opts     Options
	stateDir string
	log      *slog.Logger
	hosts    Hosts
	p        *provider.Provider
	instance string
	tokens   *buildtoken.Keyring // the machine service's tokens (token.go)

	recMu    sync.Mutex      // records.go
	creating map[string]bool // machines whose create runs in this process
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// New returns the vagrant provider.
func New(opts Options) (*Vagrant, error) {
	if opts.StateDir == "" {
		return nil, errors.New("vagrant provider: no state dir")
	}
	sd, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("vagrant provider: state dir: %w", err)
	}
	v := &Vagrant{opts: opts, stateDir: sd, log: opts.Logger, hosts: opts.Hosts, instance: opts.Instance,
		creating: map[string]bool{}}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	if v.opts.OpTimeout <= 0 {
		v.opts.OpTimeout = 10 * time.Minute
	}
	if v.instance == "" {
		b := make([]byte, 8)
		rand.Read(b)
		v.instance = "proc-" + hex.EncodeToString(b)
	} else if !idRE.MatchString(v.instance) {
		return nil, fmt.Errorf("vagrant provider: instance id %q: want 1-64 characters of [A-Za-z0-9._-]", v.instance)
	}
	v.tokens = buildtoken.New(buildtoken.Options{Dir: sd, Issuer: tokenIssuer, Audience: tokenAudience, Instance: v.instance, TTL: opts.TokenTTL})
	v.p = &provider.Provider{
		Name:         Name,
		ResourceType: ResourceType,
		UserDataAttr: UserDataAttr,
		Description:  "Vagrant machines on your own host: run `klient --vagrant` there with your kite key; kloud builds through it (any Vagrant provider; a Docker image with Vagrant's docker provider).",
		// Listed, not derived: a machine needs its record (Caps' empty probe has none).
		Capabilities: []provider.Capability{provider.CapStart, provider.CapStop, provider.CapInfo, provider.CapResources, provider.CapTemplateRules,
			provider.CapConstraints, // constraints.go
			provider.CapSnapshot},   // snapshot.go
		Constraints: v.Constraints,
		Stack:       func(b *provider.BaseStack) (provider.Stack, error) { return v.newStack(b), nil },
		Machine:     v.machine,
		Available:   v.Available,
		Handler:     v.handler(),
		Inventory:   inventory{v}, // resources.go
	}
	return v, nil
}

// Provider returns the provider to register with kloud's registry.
func (v *Vagrant) Provider() *provider.Provider { return v.p }

// Instance is this kloud's instance id.
func (v *Vagrant) Instance() string { return v.instance }

// Available reports whether kloud can build vagrant machines (a host klient is needed only for
// a build, and ApplyTemplate says when the owner has none connected).
func (v *Vagrant) Available() error {
	if v.hosts == nil {
		return errors.New("vagrant provider: no way to reach host klients configured (vagrant.Options.Hosts)")
	}
	return nil
}

// call calls method on host h with the owner's token set in params by fill, bounded by
// OpTimeout.
func (v *Vagrant) call(ctx context.Context, h *Host, method string, params, result any) error {
	ctx, cancel := context.WithTimeout(ctx, v.opts.OpTimeout)
	defer cancel()
	if err := h.Conn.Call(ctx, method, params, result); err != nil {
		return fmt.Errorf("vagrant host %s: %s: %w", h.KiteID, method, err)
	}
	return nil
}
