// Package example is a complete Kloud provider, small enough to read in one sitting and meant
// to be copied: rename it, keep the shape, replace the infrastructure. Its main package
// (../main.go) serves it as the plugin binary kloud-provider-example; the same value can also
// be registered in-process (kloud's tests do).
//
// Start reading here (New: the provider.Provider value and its schema), then stack.go (what the
// provider does for a stack: check a credential, bootstrap a team's shared resources, rewrite a
// stack's template before Terraform applies it), machine.go (start, stop, info of one machine)
// and boot.go (the provider's own HTTP service, through which Terraform creates and destroys
// machines).
//
// # The infrastructure: process machines
//
// A real provider talks to a cloud's API. This one needs nothing but the host it runs on: a
// machine is a directory (its disk: Dir/machines/<stack id>/<machine label>) plus the process
// tree of its agent (its power). Booting a machine runs the provisioning script kloud rendered
// for it (userdata.RenderScript, with the machine's directory as its root): it writes the
// machine's kite key, downloads klient from kloud, checks its checksum, starts it under a
// restart loop and runs the template author's script. Stop kills those processes and keeps the
// directory; Start starts klient again from it; Info looks at the processes; destroy kills them
// and removes the directory.
//
// Who runs what: as a plugin, everything (the provider, klient, the user's script, the
// terminal's shells) runs as the plugin's own unprivileged user, and the processes die with
// the plugin (kloud's sandbox lets nothing of a plugin outlive it). The restarted plugin
// powers on again, from their disks, the machines that were on (Resume, resume.go: a machine its
// user stopped stays off), so their agents come back within seconds. In-process (tests), they
// run as kloud's user and do not die with anything.
//
// # How Terraform creates a machine
//
// A stack template declares machines as `terraform_data` resources whose `input` is the user's
// script (Terraform's built-in resource: no Terraform provider to install). Terraform runs
// sandboxed and must not start long-lived processes itself, so ApplyTemplate adds, per machine,
// two generated resources whose local-exec provisioners call the provider's HTTP service with
// curl (kloud serves Provider.Handler at /provider/<name>/ and, for a plugin, forwards the
// request to it): one boots the machine when it is created, the other destroys it when it is
// destroyed. A token minted for that one build (HMAC, key in Dir) authorizes exactly the scripts
// kloud rendered for that stack's machines.
//
// A stack update may remove a whole machine resource block. Terraform runs a destroy-time
// provisioner only while its block exists, so ApplyTemplate keeps the generated destroy block of
// each resource that still has machines on disk, with no instances, until they are gone
// (provider.RemovedResources).
//
// # Tags and garbage collection (resources.go)
//
// Every machine has a record beside its disk (<stack>/<label>.json): kloud's tags (stack, team,
// owner, kloud's machine id, the kloud instance) and the id Terraform's state has for the
// machine resource. The provider lists the records (Provider.Inventory, capability "resources"),
// so `kloud gc` finds machines whose stack or machine record kloud no longer has, or that a build
// which died left outside Terraform's state, and removes them.
//
// # Buckets (bucket.go)
//
// Configured with an S3 server (Options.S3: SeaweedFS's address, master, weed binary and admin
// key; the plugin reads it from s3.json in its state directory or from KLOUD_EXAMPLE_S3_*), the
// provider provisions the buckets stacks claim (Provider.Buckets, capability "bucket") with
// kloud's SeaweedFS provisioner, objstore/seaweed.
package example

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
)

// Options configure the provider.
type Options struct {
	// Name is the provider's name in credentials and stacks (default "example").
	Name string
	// Dir is where machines live (Dir/machines/...) and the token key is kept. Required; the
	// plugin's main passes the state directory kloud gives it.
	Dir string
	// Capacity is how many machines one credential may ask for on this host (default 8): a
	// credential whose maxMachines is higher fails verification, as a cloud refuses a quota
	// above an account's limit.
	Capacity int
	// TokenTTL is how long a build's token may boot machines (default 1h).
	TokenTTL time.Duration
	// Logger receives the provider's log (default: discard).
	Logger *slog.Logger
	// Instance is the kloud instance whose machines this provider makes and lists (the
	// resources' kloud.instance tag; default: an id made once and kept in Dir/instance-id). A
	// launched plugin's state directory is one kloud's, so one Dir must serve one kloud.
	Instance string
	// S3, if set, is the SeaweedFS server the provider provisions stacks' buckets on
	// (capability "bucket"; bucket.go). The plugin's main reads it with LoadS3. Nil: no buckets.
	S3 *S3
	// Buckets, if set, is the provisioner to serve instead of one made from S3 (tests: a
	// seaweedtest server's).
	Buckets provider.BucketProvisioner
}

// Credential is what a user enters to use the provider (kloud credential add --field ...).
// The struct tags are the schema: kloud generates the JSON Schema, the UI's form and the CLI's
// validation from them and decodes every credential into this type before the provider sees it.
type Credential struct {
	// Label names the team's network and prefixes the machines' host names. It is immutable:
	// the bootstrapped network carries it, so changing it would orphan that network.
	Label string `json:"label" kloud:"Label,required,immutable" min:"1" max:"32" doc:"names the team's network and machines; lowercase letters, digits and dashes"`
	// MaxMachines is the most machines one stack of this credential may have.
	MaxMachines int `json:"maxMachines" kloud:"Max machines" default:"4" min:"1" max:"16" doc:"the most machines one stack may have"`
}

// Version is this provider's version: bump it with every release of the plugin.
const Version = "0.1.0"

var labelRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// Valid checks a credential's values on their own (kloud calls it after decoding, before it
// stores the credential). Errors say what to change.
func (c *Credential) Valid() error {
	if len(c.Label) > 32 || !labelRe.MatchString(c.Label) {
		return fmt.Errorf("label %q: use 1 to 32 lowercase letters, digits and dashes", c.Label)
	}
	if c.MaxMachines < 1 || c.MaxMachines > 16 {
		return fmt.Errorf("maxMachines %d: use 1 to 16", c.MaxMachines)
	}
	return nil
}

// Bootstrap is what the bootstrap template outputs (BootstrapTemplates): the team's network.
// kloud stores it with the credential and hands it back to ApplyTemplate.
type Bootstrap struct {
	NetworkID string `json:"networkId" kloud:"Network" doc:"the team's network, made once per credential"`
}

// Metadata is what the provider reports about one machine (Start, Stop, Info); kloud stores it
// with the machine.
type Metadata struct {
	PID  int    `json:"pid,omitempty" kloud:"Agent supervisor pid" doc:"0 when the machine is stopped"`
	Disk string `json:"disk" kloud:"Disk" doc:"the machine's directory on the provider's host"`
}

// Valid checks a metadata value.
func (m *Metadata) Valid() error {
	if m.PID < 0 {
		return fmt.Errorf("pid %d: must not be negative", m.PID)
	}
	return nil
}

// New returns the provider: one value with its schema and the constructors kloud calls for
// stack and machine operations. Nothing in it knows whether it runs in kloud's process or as a
// plugin.
func New(o Options) *provider.Provider {
	e := newExample(o)
	o = e.o
	p := &provider.Provider{
		Name: o.Name,
		// Machines are terraform_data resources; their `input` carries the user data.
		ResourceType: "terraform_data",
		UserDataAttr: "input",
		Description:  "example provider: machines are directories and processes on the provider's host",
		// Version is the plugin's own version, shown by `kloud provider list`.
		Version: Version,
		Schema: provider.Schema{
			NewCredential: func() any { return &Credential{} },
			NewBootstrap:  func() any { return &Bootstrap{} },
			NewMetadata:   func() any { return &Metadata{} },
		},
		Stack:   func(b *provider.BaseStack) (provider.Stack, error) { return &stack{e: e, b: b}, nil },
		Machine: func(b *provider.BaseMachine) (provider.Machine, error) { return &machine{e: e, b: b}, nil },
		// Available says why the provider cannot work here (shown by kloud provider list).
		Available: e.available,
		Handler:   e.handler(),
		// Inventory lists and removes the machines by their tags, for kloud's garbage
		// collector (resources.go); it makes the capability "resources".
		Inventory: inventory{e},
	}
	// Buckets provisions the stacks' bucket claims (bucket.go); set only when configured, so
	// that the capability "bucket" is advertised only then.
	if o.S3 != nil || o.Buckets != nil {
		p.Buckets = &buckets{e: e, p: o.Buckets}
	}
	return p
}

// newExample returns the provider's state with Options' defaults filled in.
func newExample(o Options) *example {
	if o.Name == "" {
		o.Name = "example"
	}
	if o.Capacity <= 0 {
		o.Capacity = 8
	}
	if o.TokenTTL <= 0 {
		o.TokenTTL = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &example{o: o}
}

// example is the provider's state shared by its stacks, machines and HTTP service.
type example struct {
	o Options

	keyMu      sync.Mutex // guards instance
	tokensOnce sync.Once
	bootTokens *plugin.BootTokens // the build tokens' signer (boot.go)
	instance   string             // Options.Instance or the one kept in Dir, read or made on first use

	mu   sync.Mutex
	busy map[string]*sync.Mutex // machine dir → held while it boots, starts, stops or is destroyed
}

func (e *example) available() error {
	if e.o.Dir == "" {
		return errors.New("no state directory: set Options.Dir (a plugin gets it from kloud)")
	}
	if err := os.MkdirAll(e.o.Dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return nil
}

// lock serializes the operations on one machine.
func (e *example) lock(dir string) func() {
	e.mu.Lock()
	if e.busy == nil {
		e.busy = map[string]*sync.Mutex{}
	}
	m := e.busy[dir]
	if m == nil {
		m = &sync.Mutex{}
		e.busy[dir] = m
	}
	e.mu.Unlock()
	m.Lock()
	return m.Unlock
}
