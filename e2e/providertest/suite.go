package providertest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	tfjson "github.com/hashicorp/terraform-json"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kloud/api"
	"github.com/kloud-dev/kloud/kloud/model"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/tmpl"
	"github.com/kloud-dev/kloud/terraformer"
	"github.com/kloud-dev/kloud/terraformer/tfrun"
)

// agentTimeout bounds how long an agent takes to connect or disconnect after kloud's job ended.
const agentTimeout = 2 * time.Minute

// Describe: provider.describe names the provider, its resource type and its fields; its
// capabilities agree with what it implements.
func (s *suite) testDescribe(t *testing.T) {
	res, err := s.cl.ProviderDescribe(t.Context(), api.ProviderDescribeParams{Provider: s.p.Name})
	if err != nil {
		t.Fatalf("provider.describe: %v", err)
	}
	if len(res.Providers) != 1 {
		t.Fatalf("provider.describe of %s: %d providers", s.p.Name, len(res.Providers))
	}
	d := res.Providers[0]
	if d.Name != s.p.Name || d.ResourceType == "" || d.ResourceType != s.p.ResourceType {
		t.Errorf("provider.describe: name %q resource type %q, want %q and %q (non-empty)", d.Name, d.ResourceType, s.p.Name, s.p.ResourceType)
	}
	if !d.Available {
		t.Errorf("provider.describe: not available: %s", d.Unavailable)
	}
	if d.CloudInit == (s.p.UserDataAttr == "") {
		t.Errorf("provider.describe: cloudInit %v, but the user data attribute is %q", d.CloudInit, s.p.UserDataAttr)
	}
	for part, fields := range map[string][]provider.Field{"credential": d.Credential, "bootstrap": d.Bootstrap} {
		seen := map[string]bool{}
		for _, f := range fields {
			if f.Name == "" || seen[f.Name] || f.Label == "" || !slices.Contains([]string{"string", "integer", "number", "boolean"}, f.Type) {
				t.Errorf("provider.describe: %s field %+v: want a unique name, a label and a JSON type", part, f)
			}
			seen[f.Name] = true
		}
	}
	if s.p.HasPart(provider.PartCredential) != (len(d.Credential) > 0) {
		t.Errorf("provider.describe: credential fields %v, but the provider takes a credential: %v", d.Credential, s.p.HasPart(provider.PartCredential))
	}
	wantKind := provider.KindBuiltin
	if s.c.Plugin != "" {
		wantKind = provider.KindPlugin
	}
	if d.Kind != wantKind {
		t.Errorf("provider.describe: kind %q, want %q", d.Kind, wantKind)
	}
	// Every part's schema is a JSON Schema 2020-12 of an object, and what the old field lists
	// say is what it says; the good and bad credentials fit the credential's.
	for part, sc := range map[string]json.RawMessage{provider.PartCredential: d.Schemas.Credential, provider.PartBootstrap: d.Schemas.Bootstrap, provider.PartMetadata: d.Schemas.Metadata} {
		if isNull(sc) != !s.p.HasPart(part) {
			t.Errorf("provider.describe: %s schema %s, but the provider has that part: %v", part, sc, s.p.HasPart(part))
		}
		if isNull(sc) {
			continue
		}
		if err := provider.CheckSchema(sc); err != nil {
			t.Errorf("provider.describe: %s schema: %v\n%s", part, err, sc)
		}
	}
	for part, c := range map[string]struct {
		schema json.RawMessage
		fields []provider.Field
	}{provider.PartCredential: {d.Schemas.Credential, d.Credential}, provider.PartBootstrap: {d.Schemas.Bootstrap, d.Bootstrap}} {
		if want := provider.SchemaFields(c.schema); !reflect.DeepEqual(c.fields, want) {
			t.Errorf("provider.describe: %s fields %+v, but its schema says %+v", part, c.fields, want)
		}
	}
	for name, cred := range map[string]json.RawMessage{"GoodCredential": s.c.GoodCredential, "BadCredential": s.c.BadCredential} {
		if len(cred) > 0 {
			if err := provider.Validate(d.Schemas.Credential, cred); err != nil {
				t.Errorf("Config.%s does not fit the credential's schema (the provider's VerifyCredential must refuse it, not the schema): %v", name, err)
			}
		}
	}

	caps := s.p.Caps()
	t.Logf("capabilities: %v", caps)
	if len(caps) == 0 {
		t.Errorf("provider %s advertises no capability", s.p.Name)
	}
	if !slices.Equal(d.Capabilities, caps) {
		t.Errorf("provider.describe: capabilities %v, the provider's are %v", d.Capabilities, caps)
	}
	if s.caps[provider.CapBootstrap] != s.p.HasPart(provider.PartBootstrap) {
		t.Errorf("provider %s: capability %q is %v, but it has a bootstrap part: %v", s.p.Name, provider.CapBootstrap, s.caps[provider.CapBootstrap], s.p.HasPart(provider.PartBootstrap))
	}
	// The optional interfaces are checked on the Stack subtest's real stack and machines (a
	// provider may refuse to build them from empty Base values).
}

// Credential: a good credential authenticates, a bad one is refused with the provider's reason.
func (s *suite) testCredential(t *testing.T) {
	if !s.p.HasPart(provider.PartCredential) {
		if len(s.c.GoodCredential) > 0 {
			t.Fatalf("Config.GoodCredential is set but provider %s takes no credential", s.p.Name)
		}
		t.Skipf("provider %s takes no credential", s.p.Name)
	}
	if len(s.c.GoodCredential) == 0 || len(s.c.BadCredential) == 0 {
		t.Fatalf("provider %s takes a credential: Config.GoodCredential, BadCredential and BadReason are required", s.p.Name)
	}
	add := func(title string, data json.RawMessage) string {
		t.Helper()
		res, err := s.cl.CredentialAdd(t.Context(), api.CredentialAddParams{Provider: s.p.Name, Title: title, Data: data})
		if err != nil {
			t.Fatalf("credential.add %s: %v", title, err)
		}
		return res.ID
	}
	good := add("good", s.c.GoodCredential)
	t0 := time.Now()
	res, err := s.cl.CredentialAuthenticate(t.Context(), api.CredentialRef{CredentialID: good})
	if err != nil || !res.Verified {
		t.Fatalf("credential.authenticate of the good credential: %+v, %v", res, err)
	}
	t.Logf("authenticate a good credential: %s", since(t0))
	s.goodCred = good

	bad := add("bad", s.c.BadCredential)
	res, err = s.cl.CredentialAuthenticate(t.Context(), api.CredentialRef{CredentialID: bad})
	if err != nil {
		t.Fatalf("credential.authenticate of the bad credential: %v (a refusal is a result, not an error)", err)
	}
	if res.Verified || !strings.Contains(res.Error, s.c.BadReason) {
		t.Fatalf("credential.authenticate of the bad credential: %+v, want refused with %q", res, s.c.BadReason)
	}
	t.Logf("bad credential refused: %s", res.Error)
	view, err := s.cl.CredentialDescribe(t.Context(), api.CredentialRef{CredentialID: bad})
	if err != nil || view.Verified || view.VerifyErr != res.Error {
		t.Errorf("credential.describe of the bad credential: %+v, %v: want the refusal recorded", view.Credential, err)
	}
	if _, err := s.cl.CredentialRemove(t.Context(), api.CredentialRef{CredentialID: bad}); err != nil {
		t.Errorf("credential.remove: %v", err)
	}
}

// Bootstrap: the credential's bootstrap builds; applying the bootstrap templates again to the
// same Terraform state gives the same outputs and changes no resource.
func (s *suite) testBootstrap(t *testing.T) {
	if s.goodCred == "" {
		t.Skip("needs the good credential (a provider without credentials has no bootstrap)")
	}
	if !s.caps[provider.CapBootstrap] {
		_, err := s.cl.CredentialBootstrap(t.Context(), api.CredentialBootstrapParams{CredentialID: s.goodCred})
		wantCode(t, "credential.bootstrap of a provider without bootstrap", err, kite.ErrState)
		t.Skipf("provider %s does not advertise %q", s.p.Name, provider.CapBootstrap)
	}
	res, err := s.cl.CredentialBootstrap(t.Context(), api.CredentialBootstrapParams{CredentialID: s.goodCred})
	if err != nil {
		t.Fatalf("credential.bootstrap: %v", err)
	}
	s.bootstrapped = true
	s.job(t, "bootstrap", res.JobID)
	view, err := s.cl.CredentialDescribe(t.Context(), api.CredentialRef{CredentialID: s.goodCred})
	if err != nil {
		t.Fatal(err)
	}
	b := view.Bootstrap
	if b == nil || b.Status != model.BootstrapDone || len(b.ContentIDs) == 0 {
		t.Fatalf("credential after bootstrap: %+v", b)
	}
	s.bootstrapLeft = s.c.Leftovers(t)
	t.Logf("after bootstrap: outputs %v, leftovers %v", b.Outputs, s.bootstrapLeft)

	// kloud does not bootstrap a credential twice.
	again, err := s.cl.CredentialBootstrap(t.Context(), api.CredentialBootstrapParams{CredentialID: s.goodCred})
	if err != nil || !again.AlreadyDone || again.JobID != res.JobID {
		t.Errorf("credential.bootstrap again: %+v, %v: want alreadyDone with job %s", again, err, res.JobID)
	}

	// The provider's bootstrap is idempotent: its templates, asked for again and applied to the
	// same states (as kloud does after a failed or interrupted bootstrap), change nothing.
	type snap struct {
		outputs   map[string]any
		resources map[string]any // address → attributes
	}
	snapshot := func() []snap {
		var out []snap
		for _, cid := range b.ContentIDs {
			st, err := s.tf.State(t.Context(), cid)
			if err != nil {
				t.Fatalf("state of %s: %v", cid, err)
			}
			out = append(out, snap{outputs: stateOutputs(st), resources: stateResources(st)})
		}
		return out
	}
	before := snapshot()
	cred, err := s.p.DecodePart(t.Context(), provider.PartCredential, s.c.GoodCredential, nil)
	if err != nil {
		t.Fatalf("decode the good credential: %v", err)
	}
	st, err := s.p.Stack(&provider.BaseStack{Provider: s.p, Team: team, Owner: user, Log: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	tmpls, err := st.BootstrapTemplates(t.Context(), &provider.Credential{ID: s.goodCred, Provider: s.p.Name, Team: team, Value: cred})
	if err != nil {
		t.Fatalf("BootstrapTemplates again: %v", err)
	}
	if len(tmpls) != len(b.ContentIDs) {
		t.Fatalf("BootstrapTemplates again: %d templates, kloud applied %d", len(tmpls), len(b.ContentIDs))
	}
	for i, tp := range tmpls {
		cid := tp.Key
		if cid == "" {
			cid = b.ContentIDs[i]
		}
		cfg, err := tmpl.Parse(tp.Files)
		if err != nil {
			t.Fatalf("bootstrap template %d: %v", i, err)
		}
		var declared []string
		for _, v := range cfg.Variables() {
			declared = append(declared, v.Name)
		}
		vars := credentialVariables(s.p, cred, declared)
		maps.Copy(vars, tp.Variables)
		files := map[string]string{}
		for n, c := range tp.Files {
			files[n] = string(c)
		}
		t0 := time.Now()
		id, err := s.tf.Apply(t.Context(), terraformer.Request{ContentID: cid, Files: files, Variables: vars})
		if err != nil {
			t.Fatalf("apply bootstrap template %d again: %v", i, err)
		}
		final, err := s.tf.Wait(t.Context(), id, nil)
		if err != nil || final.Status != tfrun.StatusSucceeded {
			t.Fatalf("apply bootstrap template %d again: %v %v", i, final, err)
		}
		t.Logf("bootstrap template %d applied again: %s", i, since(t0))
	}
	after := snapshot()
	for i := range before {
		if !reflect.DeepEqual(before[i].outputs, after[i].outputs) {
			t.Errorf("bootstrap %s again: outputs %v, were %v", b.ContentIDs[i], after[i].outputs, before[i].outputs)
		}
		if !reflect.DeepEqual(before[i].resources, after[i].resources) {
			t.Errorf("bootstrap %s again changed its resources:\nbefore %v\nafter  %v", b.ContentIDs[i], before[i].resources, after[i].resources)
		}
	}
	if left := s.c.Leftovers(t); !slices.Equal(sorted(left), sorted(s.bootstrapLeft)) {
		t.Errorf("bootstrap again: the provider's infrastructure is %v, was %v", left, s.bootstrapLeft)
	}
}

func stateOutputs(st *tfjson.State) map[string]any {
	out := map[string]any{}
	if st != nil && st.Values != nil {
		for k, o := range st.Values.Outputs {
			out[k] = o.Value
		}
	}
	return out
}

func stateResources(st *tfjson.State) map[string]any {
	out := map[string]any{}
	if st == nil || st.Values == nil || st.Values.RootModule == nil {
		return out
	}
	var walk func(m *tfjson.StateModule)
	walk = func(m *tfjson.StateModule) {
		for _, r := range m.Resources {
			out[r.Address] = r.AttributeValues
		}
		for _, c := range m.ChildModules {
			walk(c)
		}
	}
	walk(st.Values.RootModule)
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// Stack: two machines build to Running with both agents connected.
func (s *suite) testStack(t *testing.T) {
	var creds map[string]string
	if s.goodCred != "" {
		creds = map[string]string{s.p.Name: s.goodCred}
	} else if s.p.HasPart(provider.PartCredential) {
		t.Skip("needs the good credential, which the Credential subtest did not add")
	}
	s.createAndBuild(t, user, "conformance", s.stackTemplate(), creds, 2)
	ms := s.list(t)
	var labels []string
	for l, m := range ms {
		labels = append(labels, l)
		if m.State != provider.Running || m.Agent.Status != model.AgentConnected || m.KiteID == "" {
			t.Errorf("machine %s after the build: %s (%s), agent %s, kite id %q: want running with its agent connected", l, m.State, m.Reason, m.Agent.Status, m.KiteID)
		}
		if len(s.env.Server.Kontrol.Lookup(kite.Identity{ID: m.KiteID})) != 1 {
			t.Errorf("machine %s: its agent %s is not registered with kontrol", l, m.KiteID)
		}
	}
	sort.Strings(labels)
	for _, l := range labels {
		s.machines = append(s.machines, ms[l])
	}
	if t.Failed() {
		return
	}
	if left := s.c.Leftovers(t); len(left) <= len(s.bootstrapLeft) {
		t.Errorf("Leftovers with the stack built: %v: it does not see the machines (Destroy cannot check anything)", left)
	}
	// What the real stack and machines implement is what the provider advertises.
	st, err := s.p.Stack(&provider.BaseStack{Provider: s.p, StackID: s.stackID, Team: team, Owner: user, Log: testutil.Logger(t)})
	if err != nil {
		t.Fatalf("the provider's Stack: %v", err)
	}
	if _, isCV := st.(provider.ConstraintsValidator); s.caps[provider.CapConstraints] && !isCV {
		t.Errorf("provider %s advertises %q, but its stack does not implement it", s.p.Name, provider.CapConstraints)
	}
	if _, isTV := st.(provider.TemplateValidator); s.caps[provider.CapTemplateRules] && !isTV {
		t.Errorf("provider %s advertises %q, but its stack does not implement provider.TemplateValidator", s.p.Name, provider.CapTemplateRules)
	}
	for _, m := range s.machines {
		pm, err := s.p.Machine(s.base(t, m))
		if err != nil {
			t.Fatalf("the provider's Machine for %s: %v", m.Label, err)
		}
		cl, isCL := pm.(provider.ConsoleLogger)
		_, isRS := pm.(provider.Resizer)
		for c, has := range map[provider.Capability]bool{provider.CapConsoleLog: isCL, provider.CapResize: isRS} {
			switch {
			case s.caps[c] && !has:
				t.Errorf("provider %s advertises %q, but machine %s does not implement it", s.p.Name, c, m.Label)
			case has && !s.caps[c] && s.p.Capabilities == nil:
				// Derived capabilities probe a machine built from an empty BaseMachine, which a
				// provider may refuse (local needs the id attribute): it must then set
				// Provider.Capabilities.
				t.Errorf("machine %s implements %q but provider %s does not advertise it, so kloud never uses it: its Machine refuses an empty BaseMachine, so set Provider.Capabilities", m.Label, c, s.p.Name)
			}
		}
		if isCL && s.caps[provider.CapConsoleLog] {
			if _, err := cl.ConsoleLog(t.Context()); err != nil {
				t.Errorf("provider %s advertises consoleLog; ConsoleLog of %s: %v", s.p.Name, m.Label, err)
			}
		}
	}
}

// base is machine m as kloud gives it to its provider.
func (s *suite) base(t *testing.T, m Machine) *provider.BaseMachine {
	return &provider.BaseMachine{ID: m.ID, Label: m.Label, StackID: m.StackID, Provider: s.p, KiteID: m.KiteID,
		Owner: m.Owner, Attributes: m.Attributes, Meta: m.Meta, Log: testutil.Logger(t)}
}

// InfoBehindBack: a machine stopped without kloud is Stopped for machine.info and the store;
// machine.start brings it back.
func (s *suite) testInfoBehindBack(t *testing.T) {
	s.needStack(t)
	s.needCap(t, provider.CapInfo)
	m := s.machines[0]
	t0 := time.Now()
	s.c.StopBehindBack(t, m)
	var info api.MachineInfo
	// Minutes: each machine.info asks the provider (vagrant status: Ruby, tens of seconds on a
	// loaded host).
	testutil.Eventually(t, 3*time.Minute, func() bool {
		var err error
		info, err = s.cl.MachineInfo(t.Context(), api.MachineRef{MachineID: m.ID})
		if err != nil {
			t.Fatalf("machine.info: %v", err)
		}
		return info.InfraState == provider.Stopped
	}, "machine.info of %s stopped behind kloud's back: %s", m.Label, lazy(func() string {
		return fmt.Sprintf("infra state %q, infoError %q", info.InfraState, info.InfoError) // the last answer
	}))
	if info.State != provider.Stopped {
		t.Errorf("machine.info: the provider says %s, kloud's answer is %s", info.InfraState, info.State)
	}
	if got := s.list(t)[m.Label]; got.State != provider.Stopped {
		t.Errorf("machine.list after machine.info: %s, want the store to agree with the provider (stopped)", got.State)
	}
	t.Logf("stopped behind kloud's back, seen by machine.info: %s", since(t0))
	if !s.caps[provider.CapStart] {
		return
	}
	ref, err := s.cl.MachineStart(t.Context(), api.MachineRef{MachineID: m.ID})
	if err != nil {
		t.Fatalf("machine.start: %v", err)
	}
	s.job(t, "start it again", ref.JobID)
	s.waitMachine(t, m.Label, provider.Running, model.AgentConnected, agentTimeout)
}

// StopStartKeepsDisk: a file written on the machine survives machine.stop and machine.start.
func (s *suite) testStopStartKeepsDisk(t *testing.T) {
	s.needStack(t)
	s.needCap(t, provider.CapStop)
	s.needCap(t, provider.CapStart)
	m := s.machines[len(s.machines)-1]
	if got := s.list(t)[m.Label]; got.State != provider.Running || got.Agent.Status != model.AgentConnected {
		t.Fatalf("machine %s before the test: %s, agent %s", m.Label, got.State, got.Agent.Status)
	}
	b := make([]byte, 8)
	rand.Read(b)
	const path = "kloud-conformance.txt"
	data := "written by the conformance suite " + hex.EncodeToString(b)
	s.c.WriteFile(t, m, path, data)
	if got := s.c.ReadFile(t, m, path); got != data {
		t.Fatalf("ReadFile right after WriteFile: %q, want %q (the hooks disagree)", got, data)
	}
	ref, err := s.cl.MachineStop(t.Context(), api.MachineRef{MachineID: m.ID})
	if err != nil {
		t.Fatalf("machine.stop: %v", err)
	}
	s.job(t, "stop", ref.JobID)
	t0 := time.Now()
	s.waitMachine(t, m.Label, provider.Stopped, model.AgentDisconnected, agentTimeout)
	t.Logf("agent seen disconnected after the stop: %s", since(t0))
	_, err = s.cl.MachineStop(t.Context(), api.MachineRef{MachineID: m.ID})
	wantCode(t, "machine.stop of a stopped machine", err, kite.ErrState)
	if info, err := s.cl.MachineInfo(t.Context(), api.MachineRef{MachineID: m.ID}); err != nil || info.InfraState != provider.Stopped {
		t.Errorf("machine.info after machine.stop: %s (%s), %v", info.InfraState, info.InfoError, err)
	}
	ref, err = s.cl.MachineStart(t.Context(), api.MachineRef{MachineID: m.ID})
	if err != nil {
		t.Fatalf("machine.start: %v", err)
	}
	s.job(t, "start", ref.JobID)
	t0 = time.Now()
	s.waitMachine(t, m.Label, provider.Running, model.AgentConnected, agentTimeout)
	t.Logf("agent connected again after the start: %s", since(t0))
	if got := s.c.ReadFile(t, m, path); got != data {
		t.Errorf("after stop and start, %s holds %q, want %q", path, got, data)
	}
}

// InvalidInputs: each gets the right kite code and says what is wrong.
func (s *suite) testInvalidInputs(t *testing.T) {
	ctx := t.Context()
	add := func(what string, prov string, data string, want error, mention string) {
		t.Helper()
		_, err := s.cl.CredentialAdd(ctx, api.CredentialAddParams{Provider: prov, Title: "invalid", Data: json.RawMessage(data)})
		wantCode(t, what, err, want)
		if err != nil && mention != "" && !strings.Contains(err.Error(), mention) {
			t.Errorf("%s: %q does not mention %q", what, err, mention)
		}
	}
	add("credential.add of an unknown provider", "no-such-provider", `{}`, kite.ErrInvalidParams, "no-such-provider")
	if _, err := s.cl.ProviderDescribe(ctx, api.ProviderDescribeParams{Provider: "no-such-provider"}); !errors.Is(err, kite.ErrNotFound) {
		t.Errorf("provider.describe of an unknown provider: %v, want %v", err, kite.ErrNotFound)
	}
	if !s.p.HasPart(provider.PartCredential) {
		add("credential.add for a provider without credentials", s.p.Name, `{"x":1}`, kite.ErrInvalidParams, s.p.Name)
	} else {
		add("credential.add with data that is not a JSON object", s.p.Name, `"just a string"`, kite.ErrInvalidParams, "JSON object")
		good := map[string]any{}
		if err := json.Unmarshal(s.c.GoodCredential, &good); err != nil {
			t.Fatalf("Config.GoodCredential is not a JSON object: %v", err)
		}
		unknown := maps.Clone(good)
		unknown["noSuchFieldXyz"] = "x"
		b, _ := json.Marshal(unknown)
		add("credential.add with an unknown field", s.p.Name, string(b), kite.ErrInvalidParams, "noSuchFieldXyz")
		for _, f := range requiredFields(s.p, provider.PartCredential) {
			missing := maps.Clone(good)
			delete(missing, f)
			b, _ := json.Marshal(missing)
			add("credential.add without required field "+f, s.p.Name, string(b), kite.ErrInvalidParams, f)
		}
	}
	if len(s.machines) == 0 {
		t.Log("no stack: machine.start of a running machine not tested")
		return
	}
	m := s.machines[0]
	if got := s.list(t)[m.Label]; got.State != provider.Running {
		t.Fatalf("machine %s is %s, want running", m.Label, got.State)
	}
	_, err := s.cl.MachineStart(ctx, api.MachineRef{MachineID: m.ID})
	wantCode(t, "machine.start of a running machine", err, kite.ErrState)
	_, err = s.cl.MachineInfo(ctx, api.MachineRef{MachineID: "no-such-machine"})
	wantCode(t, "machine.info of an unknown machine", err, kite.ErrNotFound)
	// What the provider does not advertise, kloud refuses (-32005) without asking it.
	if !s.caps[provider.CapStop] {
		_, err = s.cl.MachineStop(ctx, api.MachineRef{MachineID: m.ID})
		wantCode(t, "machine.stop of a provider without stop", err, kite.ErrState)
		if got := s.list(t)[m.Label]; got.State != provider.Running {
			t.Errorf("machine %s after a refused machine.stop: %s", m.Label, got.State)
		}
	}
}

// Destroy: stack destroy leaves none of the stack; with the bootstrap destroyed, nothing at all.
func (s *suite) testDestroy(t *testing.T) {
	if s.stackID != "" {
		ref, err := s.cl.StackApply(t.Context(), api.StackApplyParams{StackID: s.stackID, Destroy: true})
		if err != nil {
			t.Fatalf("stack.apply destroy: %v", err)
		}
		s.job(t, "destroy the stack", ref.JobID)
		s.stackID, s.machines = "", nil
		if n := len(s.list(t)); n != 0 {
			t.Errorf("machine.list after destroy: %d machines", n)
		}
		var left []string
		testutil.Eventually(t, 30*time.Second, func() bool {
			left = s.c.Leftovers(t)
			return slices.Equal(sorted(left), sorted(s.bootstrapLeft))
		}, "after the stack's destroy the provider still has %v (the bootstrap's: %v)", left, s.bootstrapLeft)
	}
	if s.bootstrapped {
		res, err := s.cl.CredentialBootstrap(t.Context(), api.CredentialBootstrapParams{CredentialID: s.goodCred, Destroy: true})
		if err != nil {
			t.Fatalf("credential.bootstrap destroy: %v", err)
		}
		s.bootstrapped = false
		s.job(t, "destroy the bootstrap", res.JobID)
	}
	var left []string
	testutil.Eventually(t, 30*time.Second, func() bool {
		left = s.c.Leftovers(t)
		return len(left) == 0
	}, "after destroy the provider still has %v", left)
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// createAndBuild creates, as s's user who (s.cl), a template of files (Config.Template(n) or the
// user-script variant) titled title, a stack of it with creds, checks the stack has n machines
// of the provider under test, sets s.stackID (s.cleanup destroys it) and builds it.
func (s *suite) createAndBuild(t *testing.T, who, title string, files, creds map[string]string, n int) api.StackCreateResult {
	t.Helper()
	ctx := t.Context()
	tp, err := s.cl.TemplateCreate(ctx, api.TemplateParams{Title: title, Files: files})
	if err != nil {
		t.Fatalf("template.create as %s: %v", who, err)
	}
	created, err := s.cl.StackCreate(ctx, api.StackPlanParams{TemplateID: tp.ID, Title: title, Credentials: creds})
	if err != nil {
		t.Fatalf("stack.create as %s: %v", who, err)
	}
	if len(created.Machines) != n {
		t.Fatalf("stack.create as %s: %d machines, want %d (Config.Template(%d))", who, len(created.Machines), n, n)
	}
	for _, m := range created.Machines {
		if m.Provider != s.p.Name {
			t.Fatalf("stack.create as %s: machine %s is of provider %s", who, m.Label, m.Provider)
		}
	}
	s.stackID = created.Stack.ID
	ref, err := s.cl.StackApply(ctx, api.StackApplyParams{StackID: s.stackID})
	if err != nil {
		t.Fatalf("stack.apply as %s: %v", who, err)
	}
	s.job(t, fmt.Sprintf("build %s's stack of %d machine(s)", who, n), ref.JobID)
	return created
}
