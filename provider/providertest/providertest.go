package providertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// Machine is a machine as kloud's machine.list shows it (id, label, stack, kite id, the
// resource's Terraform attributes, the provider's metadata): what the hooks get to find the
// machine in the provider's infrastructure.
type Machine = api.Machine

// Config is what a provider gives the suite. Provider (or Plugin and Name), Template,
// StopBehindBack, WriteFile, ReadFile and Leftovers are required; GoodCredential, BadCredential
// and BadReason are required for a provider that takes a credential.
type Config struct {
	// Provider is the provider under test, run in kloud's process (registered in the test
	// kloud's registry as kloud serve registers it).
	Provider *provider.Provider
	// Plugin is the path of a kloud-provider-NAME binary, run out of process: the suite starts
	// it through the test kloud's plugin launcher and tests kloud's proxy of it. Name is the
	// provider's name. Set Plugin or Provider, not both.
	// TODO(P2/E): not implemented until provider/plugin and the launcher are on main (see
	// startPlugin).
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
	// BuildTimeout bounds one job (a stack build, destroy, bootstrap, start or stop). Default 5
	// minutes.
	BuildTimeout time.Duration
}

// The user the suite works as, and its team.
const (
	user = "conformance"
	team = kloud.DefaultTeam
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
}

// Run runs the conformance suite for c as subtests of t.
func Run(t *testing.T, c Config) {
	t.Helper()
	if err := c.check(); err != nil {
		t.Fatalf("providertest: %s", err)
	}
	if c.BuildTimeout <= 0 {
		c.BuildTimeout = 5 * time.Minute
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
	t.Run("Stack", s.testStack)
	t.Run("InfoBehindBack", s.testInfoBehindBack)
	t.Run("StopStartKeepsDisk", s.testStopStartKeepsDisk)
	t.Run("InvalidInputs", s.testInvalidInputs)
	t.Run("Destroy", s.testDestroy)
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

// start starts kloud with the provider, a terraformer, and the suite's user.
func (s *suite) start(t *testing.T) {
	t.Helper()
	ko := s.c.Kloud
	ko.Providers = provider.NewRegistry()
	if ko.KlientBin == "" {
		ko.KlientBin = testutil.BuildBinary(t, "./cmd/klient")
	}
	if s.c.Provider != nil {
		ko.Providers.Register(s.c.Provider)
	}
	s.env = kloudtest.Start(t, ko)
	s.tf = s.env.StartTerraformerWith(s.c.Terraform)
	if s.c.Plugin != "" {
		s.p = s.startPlugin(t, ko.Providers)
	} else {
		s.p = s.c.Provider
	}
	if s.p.Available != nil {
		if err := s.p.Available(); err != nil {
			testutil.Unavailable(t, "provider %s is not available on this host: %s", s.p.Name, err)
		}
	}
	s.caps = map[provider.Capability]bool{}
	for _, c := range capabilities(s.p) {
		s.caps[c] = true
	}
	if _, err := s.env.Client(kloud.Admin).UserAdd(t.Context(), api.UserAddParams{Username: user, Team: team}); err != nil {
		t.Fatal(err)
	}
	s.cl = s.env.Client(user)
}

// startPlugin launches the plugin binary through the test kloud and returns the proxy kloud
// registered for it.
//
// TODO(P2/E): with provider/plugin and kloud's launcher on main: start kloud with a plugin dir
// holding a copy of c.Plugin (kloudtest.Options gains the plugin dir), wait for
// Server.Plugins().Wait(ctx, c.Name), and return registry.Lookup(c.Name) (the proxy). The rest
// of the suite is the same for both modes: it talks to kloud's API, and to the provider only
// through the *provider.Provider in kloud's registry.
func (s *suite) startPlugin(t *testing.T, reg *provider.Registry) *provider.Provider {
	t.Helper()
	t.Fatalf("providertest: Config.Plugin (%s): the plugin harness is not implemented yet (needs provider/plugin and kloud's plugin launcher)", s.c.Plugin)
	return nil
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

// capabilities returns p's capabilities: Provider.Capabilities if set (a plugin's proxy, or a
// provider advertising less), else derived from what it implements.
// TODO(S): p.Caps() once provider/capability.go is on main; until then derived as it will be.
func capabilities(p *provider.Provider) []provider.Capability {
	if p.Capabilities != nil {
		out := slices.Clone(p.Capabilities)
		slices.Sort(out)
		return slices.Compact(out)
	}
	out := []provider.Capability{provider.CapStart, provider.CapStop, provider.CapInfo}
	if m := implements(p); m.consoleLog {
		out = append(out, provider.CapConsoleLog)
	}
	if m := implements(p); m.resize {
		out = append(out, provider.CapResize)
	}
	if m := implements(p); m.constraints {
		out = append(out, provider.CapConstraints)
	}
	if hasPart(p, partBootstrap) {
		out = append(out, provider.CapBootstrap)
	}
	slices.Sort(out)
	return out
}

// optional says which optional interfaces p's Stack and Machine implement (built from empty
// Base values, as provider.Caps probes them).
type optional struct{ consoleLog, resize, constraints bool }

func implements(p *provider.Provider) (o optional) {
	func() {
		defer func() { recover() }()
		if m, err := p.Machine(&provider.BaseMachine{Provider: p}); err == nil {
			_, o.consoleLog = m.(provider.ConsoleLogger)
			_, o.resize = m.(provider.Resizer)
		}
	}()
	func() {
		defer func() { recover() }()
		if st, err := p.Stack(&provider.BaseStack{Provider: p}); err == nil {
			_, o.constraints = st.(provider.ConstraintsValidator)
		}
	}()
	return o
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
	}, "machine %s: want %s with its agent %s, have %s (%s) with its agent %s", label, state, agent, m.State, m.Reason, m.Agent.Status)
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

// Schema parts.
const (
	partCredential = "credential"
	partBootstrap  = "bootstrap"
)

// TODO(S): hasPart, decodePart and requiredFields become p.HasPart, p.DecodePart and the part's
// JSON Schema ("required") once provider/schema.go is on main: a plugin's proxy has no New*
// types, only Schema.JSON and a Decoder.

// hasPart reports whether p's schema has the part.
func hasPart(p *provider.Provider, part string) bool {
	switch part {
	case partCredential:
		return p.Schema.NewCredential != nil
	case partBootstrap:
		return p.Schema.NewBootstrap != nil
	}
	return false
}

// decodePart decodes raw as p's part, as kloud does (strict, defaults, required, Valid).
func decodePart(_ context.Context, p *provider.Provider, part string, raw json.RawMessage) (any, error) {
	newFn := p.Schema.NewCredential
	if part == partBootstrap {
		newFn = p.Schema.NewBootstrap
	}
	return provider.Decode(newFn, raw)
}

// requiredFields lists the part's required fields that have no default.
func requiredFields(p *provider.Provider, part string) []string {
	if !hasPart(p, part) {
		return nil
	}
	newFn := p.Schema.NewCredential
	if part == partBootstrap {
		newFn = p.Schema.NewBootstrap
	}
	var out []string
	for _, f := range provider.Fields(newFn()) {
		if f.Required && f.Default == "" {
			out = append(out, f.Name)
		}
	}
	return out
}
