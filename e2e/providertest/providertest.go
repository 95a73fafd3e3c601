package providertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/kloudtest"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// Machine is a machine as kloud's machine.list shows it (id, label, stack, kite id, the
// resource's Terraform attributes, the provider's metadata): what the hooks get to find the
// machine in the provider's infrastructure.
type Machine = model.Machine

// Config is what a provider gives the suite. Provider (or Plugin and Name), Template,
// StopBehindBack, WriteFile, ReadFile and Leftovers are required; GoodCredential, BadCredential
// and BadReason are required for a provider that takes a credential.
type Config struct {
	// Provider is the provider under test, run in kloud's process (registered in the test
	// kloud's registry as kloud serve registers it).
	Provider *provider.Provider
	// Plugin is the path of a kloud-provider-NAME binary (provider/plugin), run out of process:
	// the suite installs it in the test kloud's plugin directory, kloud's launcher starts it
	// (sandboxed, as Kloud.Plugins says), and the suite tests kloud's proxy of it. Name is the
	// provider's name. Set Plugin or Provider, not both.
	Plugin string
	Name   string

	// GoodCredential is credential data (credential.add's data) that authenticates;
	// BadCredential is well formed but refused by the provider's VerifyCredential, with an error
	// containing BadReason.
	GoodCredential, BadCredential json.RawMessage
	BadReason                     string

	// Template returns the files (name → content) of a template of n machines of this provider,
	// each with user data the provider's ApplyTemplate fills with the agent (n is 2).
	Template func(n int) map[string]string
	// UserScriptTemplate, if set, is Template with the template author's own user data on
	// every machine (the provider's way: a user_data argument, a label, ...): a shell script
	// that writes data to path, where ReadFile(path) reads it. The suite then builds its stack
	// from it and checks the script ran on every machine (subtest UserScript; skipped if nil).
	UserScriptTemplate func(n int, path, data string) map[string]string
	// ReplaceTemplate, if set, is a template of n machines like the stack's (Template, or
	// UserScriptTemplate) with a change its provider applies by replacing the machines (a new
	// container, a new sandbox). UpdateKeepsPorts updates the stack to it and checks a replaced
	// machine keeps its firewall rules (skipped if nil or without the firewall capability).
	ReplaceTemplate func(n int) map[string]string

	// StopBehindBack stops machine m without kloud (as a user of the cloud's console, a crash
	// or the host would): kloud's store still says Running.
	StopBehindBack func(t *testing.T, m Machine)
	// WriteFile writes data to the file at path (relative to the machine's root or the owner's
	// home, the hook's choice) on the running machine m; ReadFile reads it back.
	WriteFile func(t *testing.T, m Machine, path, data string)
	ReadFile  func(t *testing.T, m Machine, path string) string
	// Leftovers lists what of the provider's infrastructure made by this test exists (machines,
	// disks, networks, processes: any stable description, one entry per thing). It must be empty
	// before the suite starts and after Destroy, and list the stack's machines while it exists.
	Leftovers func(t *testing.T) []string

	// Kloud tunes the test kloud: e.g. Addr (the local provider's machines reach kloud on its
	// bridge) or AgentTimeout. The suite sets Providers, and KlientBin if empty (klient built
	// from this tree).
	Kloud kloudtest.Options
	// Terraform tunes the terraformer's engine: TerraformPath and CLIConfigFile for a provider
	// whose Terraform provider is not in the default mirror. Zero: tfruntest's defaults.
	Terraform tfrun.Options
	// BuildTimeout bounds one job (a stack build, destroy, bootstrap, start or stop). Default 12
	// minutes: above kloud's own bounds (the provider's work, then up to 5 minutes for the
	// agents), so that a job the host slowed down ends by itself, as it or failed, rather than
	// the test giving up first (ci51: vagrant's machine.start, a vagrant up and the agent's
	// wait on a host at load 35, took over 5 minutes).
	BuildTimeout time.Duration
}

// The user the suite works as, and its team.
const (
	user = "conformance"
	team = model.DefaultTeam
)

// suite is one Run: the test kloud, its terraformer, and what the subtests hand on.
type suite struct {
	c    Config
	p    *provider.Provider // the registered provider (in-process, or the plugin's proxy)
	env  *kloudtest.Env
	tf   *terraformer.Client
	cl   *api.Client
	caps map[provider.Capability]bool

	goodCred string // the good credential's id ("" for a provider without credentials)
	// bootstrapLeft is what Leftovers lists after the bootstrap (it stays until the bootstrap
	// is destroyed).
	bootstrapLeft []string
	bootstrapped  bool
	stackID       string
	machines      []Machine // the stack's, sorted by label
	resStack      string    // resources.go: the stack whose resources Resources saw
}

// Run runs the conformance suite for c as subtests of t.
func Run(t *testing.T, c Config) {
	t.Helper()
	if err := c.check(); err != nil {
		t.Fatalf("providertest: %s", err)
	}
	if c.BuildTimeout <= 0 {
		c.BuildTimeout = 12 * time.Minute
	}
	testutil.RequireBinary(t, "curl")
	s := &suite{c: c}
	t0 := time.Now()
	s.start(t)
	t.Logf("kloud, terraformer and provider %s up: %s", s.p.Name, since(t0))
	if left := c.Leftovers(t); len(left) != 0 {
		t.Fatalf("Leftovers before the suite made anything: %v (the suite needs infrastructure of its own)", left)
	}
	t.Cleanup(func() { s.cleanup(t) })

	t.Run("Describe", s.testDescribe)
	t.Run("Credential", s.testCredential)
	t.Run("Bootstrap", s.testBootstrap)
	t.Run("Constraints", s.testConstraints) // constraints.go
	t.Run("Bucket", s.testBucket)           // bucket.go
	t.Run("Stack", s.testStack)
	t.Run("UserScript", s.testUserScript)
	t.Run("InfoBehindBack", s.testInfoBehindBack)
	t.Run("StopStartKeepsDisk", s.testStopStartKeepsDisk)
	t.Run("Snapshot", s.testSnapshot) // snapshot.go
	// firewall_enforced.go (before Update, which leaves the stack one machine)
	t.Run("FirewallEnforced", s.testFirewallEnforced)
	t.Run("Update", s.testUpdate)                     // update.go
	t.Run("UpdateKeepsPorts", s.testUpdateKeepsPorts) // update_ports.go
	t.Run("InvalidInputs", s.testInvalidInputs)
	t.Run("Firewall", s.testFirewall)   // firewall.go
	t.Run("Resources", s.testResources) // resources.go
	t.Run("Destroy", s.testDestroy)
	t.Run("ResourcesGone", s.testResourcesGone) // resources.go
	t.Logf("conformance suite of provider %s: %s", s.p.Name, since(t0))
}

func (c *Config) check() error {
	var missing []string
	if (c.Provider == nil) == (c.Plugin == "") {
		return errors.New("set Config.Provider (in process) or Config.Plugin (a plugin binary), exactly one")
	}
	if c.Plugin != "" && c.Name == "" {
		missing = append(missing, "Name")
	}
	for name, set := range map[string]bool{
		"Template": c.Template != nil, "StopBehindBack": c.StopBehindBack != nil, "WriteFile": c.WriteFile != nil,
		"ReadFile": c.ReadFile != nil, "Leftovers": c.Leftovers != nil,
	} {
		if !set {
			missing = append(missing, name)
		}
	}
	if len(c.BadCredential) > 0 && c.BadReason == "" {
		missing = append(missing, "BadReason (with BadCredential)")
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("Config misses %s (see the package doc)", strings.Join(missing, ", "))
	}
	return nil
}

// start starts kloud with the provider (registered, or launched as a plugin), a terraformer,
// and the suite's user.
func (s *suite) start(t *testing.T) {
	t.Helper()
	ko := s.c.Kloud
	ko.Providers = provider.NewRegistry()
	if ko.GC == (kloud.GCOptions{}) {
		ko.GC = kloud.GCOptions{Interval: -1, Grace: -1} // resources.go: gc.run judges every resource
	}
	if ko.KlientBin == "" {
		ko.KlientBin = testutil.BuildBinary(t, "./cmd/klient")
	}
	if ko.Limits.PlanTimeout == 0 {
		// A plan's wall time is not what the suite tests: ci52's vagrant plan of Update took
		// over kloud's default 2 minutes on a loaded host (the e2e kloud gets 10 too).
		ko.Limits.PlanTimeout = 10 * time.Minute
	}
	if s.c.Provider != nil {
		ko.Providers.Register(s.c.Provider)
	} else {
		s.installPlugin(t, &ko)
	}
	s.env = kloudtest.Start(t, ko)
	s.tf = s.env.StartTerraformerWith(s.c.Terraform)
	if s.c.Plugin != "" {
		s.p = s.waitPlugin(t, ko.Providers)
	} else {
		s.p = s.c.Provider
	}
	if s.p.Available != nil {
		if err := s.p.Available(); err != nil {
			testutil.Unavailable(t, "provider %s is not available on this host: %s", s.p.Name, err)
		}
	}
	s.caps = map[provider.Capability]bool{}
	for _, c := range s.p.Caps() {
		s.caps[c] = true
	}
	if _, err := s.env.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: user, Team: team}); err != nil {
		t.Fatal(err)
	}
	s.cl = s.env.Client(user)
}

// installPlugin copies the plugin binary into the test kloud's plugin directory (ko.PluginDir,
// default <data dir>/plugins) as kloud-provider-NAME, where kloud's launcher starts it (in its
// sandbox as an unprivileged user, unless ko.Plugins says otherwise).
func (s *suite) installPlugin(t *testing.T, ko *kloudtest.Options) {
	t.Helper()
	if ko.DataDir == "" {
		ko.DataDir = t.TempDir()
	}
	dir := ko.PluginDir
	if dir == "" {
		dir = filepath.Join(ko.DataDir, "plugins")
	}
	b, err := os.ReadFile(s.c.Plugin)
	if err != nil {
		t.Fatalf("plugin: %v", err)
	}
	// Readable by the plugin's user, writable by nobody else (kloud refuses a binary or
	// directory others may write).
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{ko.DataDir, dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, kloud.PluginPrefix+s.c.Name), b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// waitPlugin waits for the launched plugin to register and returns kloud's proxy of it.
func (s *suite) waitPlugin(t *testing.T, reg *provider.Registry) *provider.Provider {
	t.Helper()
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := s.env.Server.PluginHost()
	if err := h.Wait(ctx, s.c.Name); err != nil {
		for _, st := range h.Status() {
			if st.Name == s.c.Name {
				t.Fatalf("plugin %s did not register: %v (where: %s, last error: %s)", s.c.Name, err, st.Where, st.LastError)
			}
		}
		t.Fatalf("plugin %s did not register: %v (kloud does not know it: is the binary named %s%s?)", s.c.Name, err, kloud.PluginPrefix, s.c.Name)
	}
	p, err := reg.Lookup(s.c.Name)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != provider.KindPlugin {
		t.Fatalf("provider %s is %q, not a plugin: the name is an in-tree provider's", s.c.Name, p.Kind)
	}
	t.Logf("plugin %s (version %q) launched and registered (waited %s)", s.c.Name, p.Version, since(t0))
	return p
}

// cleanup destroys what a failed subtest left: the stack and the bootstrap, through kloud.
func (s *suite) cleanup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), s.c.BuildTimeout)
	defer cancel()
	if s.stackID != "" {
		if ref, err := s.cl.StackApply(ctx, api.StackApplyParams{StackID: s.stackID, Destroy: true}); err != nil {
			t.Errorf("cleanup: destroy stack %s: %v", s.stackID, err)
		} else if ev := s.follow(ctx, t, ref.JobID); ev.Status != api.JobSucceeded {
			t.Errorf("cleanup: destroy stack %s: %s: %s", s.stackID, ev.Status, ev.Error)
		}
	}
	if s.bootstrapped {
		if res, err := s.cl.CredentialBootstrap(ctx, api.CredentialBootstrapParams{CredentialID: s.goodCred, Destroy: true}); err != nil {
			t.Errorf("cleanup: destroy bootstrap: %v", err)
		} else if ev := s.follow(ctx, t, res.JobID); ev.Status != api.JobSucceeded {
			t.Errorf("cleanup: destroy bootstrap: %s: %s", ev.Status, ev.Error)
		}
	}
}

// follow watches job id to its end and returns its last event, logging the job's log lines.
func (s *suite) follow(ctx context.Context, t *testing.T, id string) api.JobEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, s.c.BuildTimeout)
	defer cancel()
	w, err := s.cl.JobWatch(ctx, api.JobRef{JobID: id})
	if err != nil {
		t.Fatalf("watch job %s: %v", id, err)
	}
	defer w.Close()
	var last api.JobEvent
	for {
		ev, err := w.Next(ctx)
		if errors.Is(err, kite.ErrStreamEnded) {
			return last
		}
		if err != nil {
			t.Fatalf("watch job %s: %v", id, err)
		}
		last = ev
		for _, l := range ev.Log {
			t.Logf("job %s: %s", id, l)
		}
	}
}

// job follows job id and fails the test unless it succeeds.
func (s *suite) job(t *testing.T, what, id string) {
	t.Helper()
	t0 := time.Now()
	ev := s.follow(t.Context(), t, id)
	if ev.Status != api.JobSucceeded {
		t.Fatalf("%s (job %s): %s: %s", what, id, ev.Status, ev.Error)
	}
	t.Logf("%s: %s", what, since(t0))
}

// list returns the stack's machines by label.
func (s *suite) list(t *testing.T) map[string]Machine {
	t.Helper()
	res, err := s.cl.MachineList(t.Context(), api.MachineListParams{StackID: s.stackID})
	if err != nil {
		t.Fatalf("machine.list: %v", err)
	}
	out := map[string]Machine{}
	for _, m := range res.Machines {
		out[m.Label] = m
	}
	return out
}

// waitMachine waits until machine label's state and agent status are as wanted.
func (s *suite) waitMachine(t *testing.T, label string, state provider.State, agent string, timeout time.Duration) Machine {
	t.Helper()
	var m Machine
	testutil.Eventually(t, timeout, func() bool {
		m = s.list(t)[label]
		return m.State == state && m.Agent.Status == agent
	}, "machine %s: want %s with its agent %s, have %s", label, state, agent, lazy(func() string {
		return fmt.Sprintf("%s (%s) with its agent %s", m.State, m.Reason, m.Agent.Status) // the last listing
	}))
	return m
}

// needStack skips a subtest that needs the stack when Stack did not build it.
func (s *suite) needStack(t *testing.T) {
	t.Helper()
	if len(s.machines) == 0 {
		t.Skip("needs the stack, which the Stack subtest did not build")
	}
}

// needCap skips a subtest when the provider does not advertise c.
func (s *suite) needCap(t *testing.T, c provider.Capability) {
	t.Helper()
	if !s.caps[c] {
		t.Skipf("provider %s does not advertise %q", s.p.Name, c)
	}
}

// wantCode fails the test unless err carries kite code want and a message saying something.
func wantCode(t *testing.T, what string, err, want error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error, want %v", what, want)
	case !errors.Is(err, want):
		t.Errorf("%s: %v, want code %v", what, err, want)
	default:
		t.Logf("%s: refused as it should: %v", what, err)
	}
}

func since(t0 time.Time) time.Duration { return time.Since(t0).Round(time.Millisecond) }

// credentialVariables are the Terraform variables kloud gives a template of provider p for
// credential value v (kloud/credentials.go: <provider>_<field>), for those the files declare.
func credentialVariables(p *provider.Provider, v any, declared []string) map[string]any {
	b, _ := json.Marshal(v)
	m := map[string]any{}
	json.Unmarshal(b, &m)
	out := map[string]any{}
	for k, x := range m {
		if slices.Contains(declared, p.Name+"_"+k) {
			out[p.Name+"_"+k] = x
		}
	}
	return out
}

// requiredFields lists the fields p's part requires that have no default (from its JSON Schema).
func requiredFields(p *provider.Provider, part string) []string {
	var out []string
	for _, f := range provider.SchemaFields(p.JSONSchema(part)) {
		if f.Required && f.Default == "" {
			out = append(out, f.Name)
		}
	}
	return out
}
