// Package dummy is a test-only provider whose "machines" are klient processes on the kloud host.
//
// Start with New: each test makes its own provider (no globals). A machine is a `terraform_data`
// resource whose `input` is the machine's user data (a shell script). At apply, kloud's
// InjectUserData replaces it with the agent's provisioning script (userdata.RenderScript, with a
// directory of the host, Dir/<stack id>/<label>, as the machine's root), so the rendered script
// travels through Terraform's state like a cloud machine's user data does.
//
// # Who boots a machine
//
// Terraform runs sandboxed (terraformer/tfsandbox: its own pid namespace, so everything it
// starts dies with it; an unprivileged uid; no view of the host's directories but its work dir).
// A machine must outlive that, so the provider boots it in kloud's own process, and Terraform
// only triggers it (the pattern of the local provider's machine service, for a test provider):
//
//   - ApplyTemplate adds, per machine resource, two generated resources (kloud's own file
//     kloud_dummy.tf.json, not the user's), replaced with their machine and whenever the
//     machine's script changes (every build renders new agent keys, so building a stack again
//     boots its machines again, and the planner sees their new agents):
//     `terraform_data.kloud_machine_<name>`, whose destroy-time local-exec POSTs with curl to
//     kloud's HTTP server: <kloud>/provider/<name>/v1/machines/<label>/destroy; and, created after
//     it, `terraform_data.kloud_boot_<name>`, whose create-time local-exec POSTs the machine's
//     script, read from the machine resource's `output`, to .../machines/<label>/boot. Two
//     resources because an interrupted or failed create-time provisioner leaves its resource
//     tainted, and terraform runs no destroy-time provisioner of a tainted resource:
//     kloud_machine_<name> has no create-time provisioner, so it is never tainted, and destroy
//     always reaches the service (kloud mounts Provider.Handler under provider.HandlerPrefix).
//   - Both carry a bearer token minted by ApplyTemplate for that one stack build, given to
//     Terraform as a sensitive variable (and kept in kloud_machine_<name>'s input, which is all
//     a destroy-time provisioner may read). It is HMAC-signed with a key kept in Dir (mode 0600,
//     so it survives a kloud restart, and Terraform's sandbox cannot read it) and names the stack
//     and, per machine label, the sha256 of the script kloud rendered for it: boot runs only
//     those exact scripts, only until the token expires (Options.TokenTTL); destroy accepts an
//     expired token of the stack (a stack is destroyed long after it was built), for the labels
//     it names only.
//   - Boot runs the script with bash from kloud's process (so klient and the user's script are
//     started by kloud, in its pid namespace, not in Terraform's): it writes the kite key and provision.sh under the
//     machine's root and starts provision.sh detached (setsid), which downloads klient from
//     kloud (checksum checked), starts it under a restart loop, and runs the user's script,
//     exactly what cloud-init does on a VM. So the planner and the whole build flow are tested
//     against real agents and real terraform runs (the boot resources are in the state).
//   - Destroy kills every process of the machine (all carry KLOUD_DUMMY_MACHINE=<root> in their
//     environment, inherited from the boot) and removes its directory.
//
// Stop and Start kill and restart klient's supervisor; Info reads it. ConsoleLog returns the end
// of the machine's provisioning output (its /var/log/cloud-init-output.log), which the planner
// reads to name a failed provisioning step. Failures are scriptable (Options.Fail,
// Options.BreakAgent).
package dummy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
	"github.com/kloud-dev/kloud/userdata"
)

// Options configure a dummy provider.
type Options struct {
	Name string // default "dummy"
	Dir  string // required: machines live in Dir/<stack id>/<label>; the token key in Dir
	// Fail makes the named methods fail with the given error: VerifyCredential,
	// BootstrapTemplates, ApplyTemplate, Start, Stop, Info, Boot (the boot service refuses, so
	// terraform apply fails) and BootScript (the boot fails after the machine's script started
	// provisioning, which the failed boot must then clean up).
	Fail map[string]error
	// BreakAgent breaks the agent install: "download" gives machines a wrong klient checksum.
	BreakAgent string
	// CACert is the PEM of the CA of kloud's certificate (kloud serve --tls-cert with
	// --ca-cert): the provisioners' curl trusts it, as the machines' klient does (their user
	// data carries it). Empty: the system's roots.
	CACert string
	// TokenTTL is how long a build's token may boot machines (default 1h).
	TokenTTL time.Duration
	// Logger receives the boot service's log (default: discard).
	Logger *slog.Logger
}

// Credential is the dummy's credential: a token that must not be "invalid", a region that
// cannot change once the credential exists (its bootstrap network lives there), and an optional
// quota.
type Credential struct {
	Token  string `json:"token" kloud:"API token,secret,required" min:"3" max:"256" doc:"The API token (\"invalid\" is rejected by the API)."`
	Region string `json:"region" kloud:"Region,immutable" default:"local-1" enum:"local-1|local-2" doc:"Where machines run; fixed once the credential exists."`
	Quota  int    `json:"quota,omitempty" kloud:"Machine quota" min:"1" max:"64" doc:"How many machines this credential may run (leave it out for no limit)."`
}

// Valid implements the schema's validation.
func (c *Credential) Valid() error {
	if len(c.Token) < 3 {
		return errors.New("token is too short")
	}
	return nil
}

// ValidUpdate implements the schema's update check (the region's immutability is the schema's):
// a quota may not drop below 1 once it was set (the API cannot take a limit away).
func (c *Credential) ValidUpdate(old any) error {
	o, ok := old.(*Credential)
	if !ok {
		return fmt.Errorf("dummy: old credential of type %T", old)
	}
	if o.Quota > 0 && c.Quota == 0 {
		return fmt.Errorf("quota: it was %d; a quota cannot be removed, only changed (1-64)", o.Quota)
	}
	return nil
}

// Bootstrap is what the dummy's bootstrap template outputs.
type Bootstrap struct {
	NetworkID string `json:"network_id" kloud:"Network"`
}

// New returns a dummy provider.
func New(o Options) *provider.Provider {
	if o.Name == "" {
		o.Name = "dummy"
	}
	if o.TokenTTL <= 0 {
		o.TokenTTL = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &dummy{o: o}
	return &provider.Provider{
		Name: o.Name, ResourceType: "terraform_data", UserDataAttr: "input",
		Description: "test provider: machines are klient processes on the kloud host",
		Schema: provider.Schema{
			NewCredential: func() any { return &Credential{} },
			NewBootstrap:  func() any { return &Bootstrap{} },
		},
		Stack:   func(b *provider.BaseStack) (provider.Stack, error) { return &stack{d: d, b: b}, nil },
		Machine: func(b *provider.BaseMachine) (provider.Machine, error) { return &machine{d: d, b: b}, nil },
		Handler: d.handler(),
	}
}

type dummy struct {
	o Options

	tokensOnce sync.Once
	bootTokens *plugin.BootTokens // the build tokens' signer (service.go)

	busyMu sync.Mutex
	busy   map[string]*sync.Mutex // machine root → held while it boots or is destroyed
}

// lockMachine serializes boot and destroy of one machine (a destroy may come while a boot whose
// curl terraform gave up on still runs).
func (d *dummy) lockMachine(root string) func() {
	d.busyMu.Lock()
	if d.busy == nil {
		d.busy = map[string]*sync.Mutex{}
	}
	mu, ok := d.busy[root]
	if !ok {
		mu = &sync.Mutex{}
		d.busy[root] = mu
	}
	d.busyMu.Unlock()
	mu.Lock()
	return mu.Unlock
}

func (d *dummy) fail(method string) error {
	if err, ok := d.o.Fail[method]; ok {
		return fmt.Errorf("dummy.%s: %w", method, err)
	}
	return nil
}

func (d *dummy) root(stackID, label string) string { return filepath.Join(d.o.Dir, stackID, label) }

type stack struct {
	d *dummy
	b *provider.BaseStack
}

func (s *stack) VerifyCredential(ctx context.Context, c *provider.Credential) error {
	if err := s.d.fail("VerifyCredential"); err != nil {
		return err
	}
	cr, ok := c.Value.(*Credential)
	if !ok {
		return fmt.Errorf("dummy: credential of type %T", c.Value)
	}
	if cr.Token == "invalid" {
		return errors.New("dummy: the API rejected the token")
	}
	return nil
}

func (s *stack) BootstrapTemplates(ctx context.Context, c *provider.Credential) ([]*provider.Template, error) {
	if err := s.d.fail("BootstrapTemplates"); err != nil {
		return nil, err
	}
	cr := c.Value.(*Credential)
	main := fmt.Sprintf(`resource "terraform_data" "network" {
  input = %q
}
output "network_id" {
  value = "net-${terraform_data.network.id}"
}
`, cr.Region)
	return []*provider.Template{{Files: map[string][]byte{"bootstrap.tf": []byte(main)}}}, nil
}

// Names of what ApplyTemplate generates.
const (
	generatedFile = "kloud_dummy.tf.json"
	tokenVar      = "kloud_dummy_token"
	machinesVar   = "kloud_dummy_machines_" // + resource: the labels in count order
	lifeResource  = "kloud_machine_"        // + resource: destroys the machine when it goes
	bootResource  = "kloud_boot_"           // + resource: boots it when created
)

// The generated provisioners' commands: $KLOUD_DUMMY_URL is the machine's URL in the service.
// The token goes to curl in a header file (bash process substitution), not on its command line;
// the script on stdin. --fail-with-body makes curl exit non-zero and print the service's reason
// when it refuses, which terraform's error then shows. With $KLOUD_DUMMY_CA (Options.CACert)
// curl trusts that CA (in a file descriptor, no file).
const (
	caCurl         = `$${KLOUD_DUMMY_CA:+--cacert /dev/fd/3} 3< <(printf '%s' "$${KLOUD_DUMMY_CA:-}")` // $$: terraform's escape of $
	bootCommand    = `printf '%s' "$KLOUD_DUMMY_SCRIPT" | curl --fail-with-body -sS -m 120 -H @<(echo "Authorization: Bearer $KLOUD_DUMMY_TOKEN") --data-binary @- "$KLOUD_DUMMY_URL/boot" ` + caCurl
	destroyCommand = `curl --fail-with-body -sS -m 120 -X POST -H @<(echo "Authorization: Bearer $KLOUD_DUMMY_TOKEN") "$KLOUD_DUMMY_URL/destroy" ` + caCurl
)

// destroyProvisioner is the destroy-time provisioner of a kloud_life_ resource: it asks the
// service to destroy the machine (input.url) with the stack's token (input.token).
func (d *dummy) destroyProvisioner() []any {
	return []any{map[string]any{"local-exec": map[string]any{
		"when": "destroy", "command": destroyCommand, "interpreter": []string{"/bin/bash", "-c"},
		"environment": map[string]any{"KLOUD_DUMMY_URL": "${self.input.url}", "KLOUD_DUMMY_TOKEN": "${self.input.token}", "KLOUD_DUMMY_CA": d.o.CACert},
	}}}
}

func (s *stack) ApplyTemplate(ctx context.Context, c *provider.Credential) (*provider.Template, error) {
	if err := s.d.fail("ApplyTemplate"); err != nil {
		return nil, err
	}
	if !plugin.ValidName(s.b.StackID) {
		return nil, fmt.Errorf("dummy: stack id %q is not a directory name", s.b.StackID)
	}
	labels := map[string][]string{} // resource → machine labels in index order
	counted := map[string]bool{}
	sums := map[string]string{} // label → sha256 of its boot script
	var kloudURL string
	err := s.b.InjectUserData(ctx, func(m *provider.MachineSpec, cfg userdata.Config) ([]byte, error) {
		if !plugin.ValidName(m.Label) {
			return nil, fmt.Errorf("dummy: machine label %q is not a directory name", m.Label)
		}
		// The machines are on this host, like terraform: both reach kloud where klient is
		// downloaded from.
		u, ok := strings.CutSuffix(cfg.KlientURL, "/dl/klient")
		if !ok {
			return nil, fmt.Errorf("dummy: klient URL %q is not kloud's /dl/klient", cfg.KlientURL)
		}
		kloudURL = u
		if s.d.o.BreakAgent == "download" {
			cfg.KlientSHA256 = strings.Repeat("0", 64)
		}
		script, err := userdata.RenderScript(cfg, s.d.root(s.b.StackID, m.Label))
		if err != nil {
			return nil, err
		}
		labels[m.Resource] = append(labels[m.Resource], m.Label)
		counted[m.Resource] = m.Index != nil
		sums[m.Label] = plugin.ScriptSum(script)
		return script, nil
	})
	if err != nil {
		return nil, err
	}
	gone := s.goneResources(labels)
	if len(sums) == 0 && len(gone) == 0 {
		return s.b.Template, nil
	}
	res := map[string]any{}
	for _, name := range gone {
		// A machine resource the template no longer declares (a stack update removed every
		// machine of it): Terraform runs a destroy-time provisioner only while its resource
		// block exists, so its block stays, with no instances, until the machine is gone.
		res[lifeResource+name] = map[string]any{"count": 0, "provisioner": s.d.destroyProvisioner()}
	}
	if len(sums) == 0 {
		b, err := json.MarshalIndent(map[string]any{"resource": map[string]any{"terraform_data": res}}, "", "  ")
		if err != nil {
			return nil, err
		}
		s.b.Template.Files[generatedFile] = b
		return s.b.Template, nil
	}
	token, err := s.d.mint(claims{Stack: s.b.StackID, Machines: sums, Exp: time.Now().Add(s.d.o.TokenTTL).Unix()})
	if err != nil {
		return nil, err
	}
	vars := map[string]any{tokenVar: map[string]any{"type": "string", "sensitive": true}}
	s.b.Template.Variables[tokenVar] = token
	for _, name := range slices.Sorted(maps.Keys(labels)) {
		mv := machinesVar + name
		inst, idx := "terraform_data."+name, "0"
		if counted[name] {
			inst, idx = inst+"[count.index]", "count.index"
		}
		vars[mv] = map[string]any{"type": "list(string)"}
		s.b.Template.Variables[mv] = labels[name]
		// A new script (each build mints new agent keys) boots the machine again, as a cloud
		// replaces an instance whose user data changed.
		triggers := []string{"${" + inst + ".id}", "${sha256(" + inst + ".output)}"}
		life := map[string]any{
			"triggers_replace": triggers,
			"input": map[string]any{
				"url":   kloudURL + provider.HandlerPrefix(s.b.Provider.Name) + "v1/machines/${var." + mv + "[" + idx + "]}",
				"token": "${var." + tokenVar + "}",
			},
			"provisioner": s.d.destroyProvisioner(),
		}
		lifeInst := "terraform_data." + lifeResource + name
		if counted[name] {
			lifeInst += "[count.index]"
		}
		boot := map[string]any{
			"triggers_replace": triggers,
			"input":            "${" + lifeInst + ".output}", // url and token; and boot after life
			"provisioner": []any{map[string]any{"local-exec": map[string]any{
				"command": bootCommand, "interpreter": []string{"/bin/bash", "-c"},
				"environment": map[string]any{"KLOUD_DUMMY_URL": "${self.input.url}", "KLOUD_DUMMY_TOKEN": "${self.input.token}", "KLOUD_DUMMY_SCRIPT": "${" + inst + ".output}", "KLOUD_DUMMY_CA": s.d.o.CACert},
			}}},
		}
		if counted[name] {
			life["count"] = len(labels[name])
			boot["count"] = len(labels[name])
		}
		res[lifeResource+name] = life
		res[bootResource+name] = boot
	}
	b, err := json.MarshalIndent(map[string]any{"variable": vars, "resource": map[string]any{"terraform_data": res}}, "", "  ")
	if err != nil {
		return nil, err
	}
	s.b.Template.Files[generatedFile] = b
	return s.b.Template, nil
}

// goneResources are the machine resources with machines on disk in this stack that labels
// (resource → the labels rendered now) does not have: a stack update removed them.
func (s *stack) goneResources(labels map[string][]string) []string {
	entries, err := os.ReadDir(filepath.Join(s.d.o.Dir, s.b.StackID))
	if err != nil {
		return nil
	}
	var have []string
	for _, e := range entries {
		if e.IsDir() && plugin.ValidName(provider.ResourceOfLabel(e.Name())) {
			have = append(have, e.Name())
		}
	}
	return provider.RemovedResources(have, labels)
}

type machine struct {
	d *dummy
	b *provider.BaseMachine
}

func (m *machine) root() string { return m.d.root(m.b.StackID, m.b.Label) }

func (m *machine) Info(ctx context.Context) (provider.State, any, error) {
	if err := m.d.fail("Info"); err != nil {
		return provider.Unknown, nil, err
	}
	if _, err := os.Stat(m.root()); err != nil {
		return provider.Terminated, nil, nil
	}
	if _, alive := machinePID(m.root(), userdata.SupervisorPIDPath); alive {
		return provider.Running, nil, nil
	}
	return provider.Stopped, nil, nil
}

func (m *machine) Stop(ctx context.Context) (any, error) {
	if err := m.d.fail("Stop"); err != nil {
		return nil, err
	}
	return nil, stopGroups(ctx, m.root(), userdata.SupervisorPIDPath)
}

func (m *machine) Start(ctx context.Context) (any, error) {
	if err := m.d.fail("Start"); err != nil {
		return nil, err
	}
	if _, alive := machinePID(m.root(), userdata.SupervisorPIDPath); alive {
		return nil, nil
	}
	script := filepath.Join(m.root(), userdata.StartKlientPath)
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("dummy: machine %s was never provisioned: %w", m.b.Label, err)
	}
	cmd := exec.CommandContext(ctx, "/bin/bash", script)
	cmd.Env = machineEnv(m.root())
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dummy: start %s: %w: %s", m.b.Label, err, out)
	}
	return nil, nil
}

// consoleMax bounds what ConsoleLog returns: the end of the log.
const consoleMax = 64 << 10

// ConsoleLog implements provider.ConsoleLogger: the last 64 KiB of the machine's provisioning
// output (its /var/log/cloud-init-output.log), "" before it printed anything.
func (m *machine) ConsoleLog(ctx context.Context) (string, error) {
	r, err := os.OpenRoot(m.root())
	if err != nil {
		return "", fmt.Errorf("dummy: console of %s: %w", m.b.Label, err)
	}
	defer r.Close()
	// Resolved inside the root: a symlink the machine made cannot point kloud elsewhere.
	f, err := r.Open(strings.TrimPrefix(userdata.CloudInitOutputPath, "/"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("dummy: console of %s: %w", m.b.Label, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("dummy: console of %s: %w", m.b.Label, err)
	}
	off := max(st.Size()-consoleMax, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return "", fmt.Errorf("dummy: console of %s: %w", m.b.Label, err)
	}
	return string(b), nil
}

var (
	_ provider.ConsoleLogger = (*machine)(nil)
	_ provider.Machine       = (*machine)(nil)
	_ provider.Stack         = (*stack)(nil)
)
