package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kloud-dev/kloud/internal/testutil"
	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/provider/plugin"
	"github.com/kloud-dev/kloud/userdata"
)

// The test provider "files": a machine is a file in the credential's directory holding its
// state. Small, but real: its state is on disk, its credential is checked, and everything kloud
// sends arrives in its own types.

type filesCredential struct {
	Dir   string `json:"dir" kloud:"Directory,required"`
	Token string `json:"token" kloud:"Token,secret,required"`
	Size  int    `json:"size" kloud:"Disk size" default:"7"`
}

func (c *filesCredential) Valid() error {
	if !filepath.IsAbs(c.Dir) {
		return fmt.Errorf("dir %q must be absolute", c.Dir)
	}
	return nil
}

type filesBootstrap struct {
	Prefix string `json:"prefix"`
}

// seen records what the plugin side received, for the test to check.
type seen struct {
	mu        sync.Mutex
	variables []string // template variables applyTemplate got
	configs   map[string]userdata.Config
	startIn   chan struct{} // a slow start has begun
	instance  string
}

func (s *seen) set(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

func filesProvider(name string, sn *seen, unavailable *atomic.Value) *provider.Provider {
	p := &provider.Provider{
		Name:         name,
		ResourceType: name + "_machine",
		Description:  "machines are files",
		Schema: provider.Schema{
			NewCredential: func() any { return new(filesCredential) },
			NewBootstrap:  func() any { return new(filesBootstrap) },
		},
		Available: func() error {
			if s, _ := unavailable.Load().(string); s != "" {
				return errors.New(s)
			}
			return nil
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("X-Reply", "from "+sn.instance)
			w.Header().Set("Set-Cookie", "kloud_session=planted; Path=/")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "%s %s q=%s h=%s c=%s body=%s", r.Method, r.URL.Path, r.URL.Query().Get("q"), r.Header.Get("X-Test"), r.Header.Get("Cookie"), body)
		}),
	}
	p.Stack = func(b *provider.BaseStack) (provider.Stack, error) { return &filesStack{b: b, seen: sn}, nil }
	p.Machine = func(b *provider.BaseMachine) (provider.Machine, error) { return &filesMachine{b: b, seen: sn}, nil }
	return p
}

type filesStack struct {
	b    *provider.BaseStack
	seen *seen
}

func cred(c *provider.Credential) (*filesCredential, error) {
	if c == nil {
		return nil, errors.New("no credential")
	}
	v, ok := c.Value.(*filesCredential)
	if !ok {
		return nil, fmt.Errorf("credential value is a %T, not the provider's own type", c.Value)
	}
	return v, nil
}

func (s *filesStack) VerifyCredential(_ context.Context, c *provider.Credential) error {
	v, err := cred(c)
	if err != nil {
		return err
	}
	if v.Token != "good" {
		return errors.New("token rejected by the files cloud")
	}
	if st, err := os.Stat(v.Dir); err != nil || !st.IsDir() {
		return fmt.Errorf("dir %s is not a directory", v.Dir)
	}
	return nil
}

func (s *filesStack) BootstrapTemplates(_ context.Context, c *provider.Credential) ([]*provider.Template, error) {
	v, err := cred(c)
	if err != nil {
		return nil, err
	}
	return []*provider.Template{{Key: "boot-" + c.ID, Files: map[string][]byte{"boot.tf": []byte(`output "prefix" { value = "` + filepath.Base(v.Dir) + `" }`)}}}, nil
}

func (s *filesStack) ApplyTemplate(ctx context.Context, c *provider.Credential) (*provider.Template, error) {
	if _, err := cred(c); err != nil {
		return nil, err
	}
	if c.Bootstrap == nil || c.Bootstrap.(*filesBootstrap).Prefix == "" {
		return nil, errors.New("credential not bootstrapped")
	}
	configs := map[string]userdata.Config{}
	s.seen.set(func() {
		s.seen.variables = slices.Sorted(func(yield func(string) bool) {
			for k := range s.b.Template.Variables {
				if !yield(k) {
					return
				}
			}
		})
	})
	err := s.b.InjectUserData(ctx, func(m *provider.MachineSpec, ac userdata.Config) ([]byte, error) {
		configs[m.ID] = ac
		return []byte("key=" + ac.KiteKey + " user=" + ac.Username + " host=" + ac.Hostname + " script=" + ac.UserData), nil
	})
	s.seen.set(func() { s.seen.configs = configs })
	if err != nil {
		return nil, err
	}
	return s.b.Template, nil
}

type filesMachine struct {
	b    *provider.BaseMachine
	seen *seen
}

func (m *filesMachine) path() (string, error) {
	v, err := cred(m.b.Credential)
	if err != nil {
		return "", err
	}
	return filepath.Join(v.Dir, m.b.ID), nil
}

func (m *filesMachine) set(ctx context.Context, state provider.State) (any, error) {
	if m.b.Attributes["slow"] == true {
		close(m.seen.startIn)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	p, err := m.path()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p, []byte(state), 0o644); err != nil {
		return nil, err
	}
	n, _ := m.b.Meta["n"].(float64)
	return map[string]any{"path": p, "n": n + 1, "instance": m.seen.instance}, nil
}

func (m *filesMachine) Start(ctx context.Context) (any, error) { return m.set(ctx, provider.Running) }

func (m *filesMachine) Stop(ctx context.Context) (any, error) {
	if m.b.Attributes["noStop"] == true {
		return nil, fmt.Errorf("machine %s cannot stop: %w", m.b.Label, provider.ErrUnsupported)
	}
	return m.set(ctx, provider.Stopped)
}

func (m *filesMachine) Info(context.Context) (provider.State, any, error) {
	p, err := m.path()
	if err != nil {
		return provider.Unknown, nil, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return provider.NotInitialized, map[string]any{"instance": m.seen.instance}, nil
	}
	if err != nil {
		return provider.Unknown, nil, err
	}
	return provider.State(b), map[string]any{"instance": m.seen.instance}, nil
}

func (m *filesMachine) ConsoleLog(context.Context) (string, error) {
	p, err := m.path()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(p)
	return "console: " + string(b), err
}

// The firewall: rules in a file beside the machine's.
func (m *filesMachine) portsFile() (string, error) {
	p, err := m.path()
	return p + ".ports", err
}

func (m *filesMachine) Ports(context.Context) ([]provider.PortRule, error) {
	p, err := m.portsFile()
	if err != nil {
		return nil, err
	}
	var rules []provider.PortRule
	if b, err := os.ReadFile(p); err == nil {
		err = json.Unmarshal(b, &rules)
		return rules, err
	}
	return rules, nil
}

func (m *filesMachine) changePorts(ctx context.Context, rs []provider.PortRule, open bool) ([]provider.PortRule, error) {
	rules, err := m.Ports(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		i := slices.Index(rules, r)
		if open && i < 0 {
			rules = append(rules, r)
		} else if !open && i >= 0 {
			rules = slices.Delete(rules, i, i+1)
		}
	}
	p, _ := m.portsFile()
	b, _ := json.Marshal(rules)
	return rules, os.WriteFile(p, b, 0o600)
}

func (m *filesMachine) OpenPorts(ctx context.Context, rs []provider.PortRule) ([]provider.PortRule, error) {
	return m.changePorts(ctx, rs, true)
}

func (m *filesMachine) ClosePorts(ctx context.Context, rs []provider.PortRule) ([]provider.PortRule, error) {
	return m.changePorts(ctx, rs, false)
}

// kloudEnv stands in for kloud's kite endpoint: a real kite with kitekey's Authenticator
// (plugin keys accepted), plugin.register routed to a Host with kitekey.Gate(h, KindPluginKey),
// a user method routed like every kloud method (kitekey.Gate(h)), and /provider/<name>/
// dispatched to the registry's handlers as kloud does.
type kloudEnv struct {
	t      *testing.T
	url    string
	kite   *kite.Kite
	reg    *provider.Registry
	host   *plugin.Host
	signer *kitekey.Signer
	http   *httptest.Server
}

func startKloud(t *testing.T) *kloudEnv {
	t.Helper()
	kr, err := kitekey.LoadOrCreateFileKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	verifier := &kitekey.Verifier{Keys: kr, Issuer: "kloud"}
	k, err := kite.New(kite.Options{
		Identity:      kite.Identity{Name: "kloud", Username: "kloud"},
		Authenticator: &kitekey.Authenticator{Verifier: verifier, Agents: true, Plugins: true},
		GateBuiltins:  kitekey.RefuseAgents,
		Logger:        testutil.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := provider.NewRegistry()
	reg.Register(&provider.Provider{Name: "local", ResourceType: "kloudlocal_machine"}) // in-tree
	// RestartWait: a call waits up to 2s for a plugin that went down (TestConnection).
	host := plugin.NewHost(plugin.HostOptions{Registry: reg, Logger: testutil.Logger(t), KloudVersion: "test-1", RestartWait: 2 * time.Second})
	k.Handle(plugin.MethodRegister, kitekey.Gate(kite.Typed(func(ctx context.Context, r *kite.Request, p *plugin.RegisterParams) (any, error) {
		return host.Register(ctx, r, p)
	}), kitekey.KindPluginKey))
	k.Handle("stack.list", kitekey.Gate(kite.HandlerFunc(func(context.Context, *kite.Request) (any, error) { return []string{}, nil })))
	mux := http.NewServeMux()
	mux.Handle("/kite", k)
	mux.HandleFunc("/provider/", func(w http.ResponseWriter, r *http.Request) {
		name, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/provider/"), "/")
		p, err := reg.Lookup(name)
		if err != nil || p.Handler == nil {
			http.NotFound(w, r)
			return
		}
		p.Handler.ServeHTTP(w, r)
	})
	hs := httptest.NewServer(mux)
	t.Cleanup(func() { k.Close(); hs.Close() })
	return &kloudEnv{t: t, url: hs.URL + "/kite", kite: k, reg: reg, host: host, http: hs,
		signer: &kitekey.Signer{Current: kr.Current, Issuer: "kloud"}}
}

func (e *kloudEnv) pluginKey(name string) string {
	e.t.Helper()
	key, err := e.signer.PluginKey(kitekey.PluginKeySpec{Provider: name, TTL: time.Hour})
	if err != nil {
		e.t.Fatal(err)
	}
	return key
}

// run serves p with Run in a goroutine until the test ends (or stop is called); the returned
// channel gets Run's result.
func (e *kloudEnv) run(p *provider.Provider, key string) (stop func(), done <-chan error) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	fin := make(chan struct{})
	var res error
	go func() {
		res = plugin.Run(ctx, p, plugin.Options{URL: e.url, Key: key, Version: "1.2.3", Logger: testutil.Logger(e.t), MaxBackoff: 500 * time.Millisecond})
		ch <- res
		close(fin)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-fin:
		case <-time.After(10 * time.Second):
			e.t.Error("Run did not return after its ctx ended")
		}
	}
	e.t.Cleanup(stop)
	return stop, ch
}

func (e *kloudEnv) wait(name string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	if err := e.host.Wait(ctx, name); err != nil {
		e.t.Fatal(err)
	}
}

func (e *kloudEnv) status(name string) plugin.Status {
	for _, s := range e.host.Status() {
		if s.Name == name {
			return s
		}
	}
	return plugin.Status{}
}

// runErr waits for Run to fail.
func runErr(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run returned nil, want a refusal")
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not give up")
	}
	return nil
}

func newSeen(instance string) *seen { return &seen{instance: instance, startIn: make(chan struct{})} }

func noUnavailable() *atomic.Value {
	v := &atomic.Value{}
	v.Store("")
	return v
}

// TestRoundTrip: every method through the proxy in kloud's registry, served by Run.
func TestRoundTrip(t *testing.T) {
	e := startKloud(t)
	sn := newSeen("a")
	unavailable := noUnavailable()
	e.run(filesProvider("files", sn, unavailable), e.pluginKey("files"))
	e.wait("files")
	ctx := t.Context()

	p, err := e.reg.Lookup("files")
	if err != nil {
		t.Fatal(err)
	}
	if p.ResourceType != "files_machine" || p.Description != "machines are files" || p.UserDataAttr != "user_data" {
		t.Fatalf("proxy %+v", p)
	}
	wantCaps := []provider.Capability{provider.CapBootstrap, provider.CapConsoleLog, provider.CapFirewall, provider.CapInfo, provider.CapStart, provider.CapStop}
	if !slices.Equal(p.Capabilities, wantCaps) {
		t.Errorf("capabilities %v, want %v", p.Capabilities, wantCaps)
	}
	st := e.status("files")
	if !st.Connected || st.Version != "1.2.3" || st.APIVersion != plugin.Version || !strings.HasPrefix(st.Where, "remote 127.0.0.1:") || !slices.Equal(st.Capabilities, wantCaps) {
		t.Errorf("status %+v", st)
	}

	// The proxy's schema is the plugin's: fields, secrets, defaults, required.
	fields := provider.Fields(p.Schema.NewCredential())
	if len(fields) != 3 || fields[1].Name != "token" || !fields[1].Secret || !fields[1].Required || fields[2].Default != "7" || fields[2].Type != "integer" || fields[0].Label != "Directory" {
		t.Errorf("credential fields %+v", fields)
	}
	dir := t.TempDir()
	raw := json.RawMessage(`{"dir":"` + dir + `","token":"good"}`)
	val, err := provider.Decode(p.Schema.NewCredential, raw) // what kloud does with a credential today
	if err != nil {
		t.Fatal(err)
	}
	if secrets := provider.SecretFields(val); !secrets["token"] || len(secrets) != 1 {
		t.Errorf("secret fields %v", secrets)
	}
	// The plugin's own decode: defaults, Valid.
	norm, err := p.Decoder(ctx, "credential", raw, nil)
	if err != nil || !strings.Contains(string(norm), `"size":7`) {
		t.Errorf("decode: %s %v", norm, err)
	}
	if _, err := p.Decoder(ctx, "credential", json.RawMessage(`{"dir":"rel","token":"x"}`), nil); err == nil || !strings.Contains(err.Error(), `dir "rel" must be absolute`) {
		t.Errorf("decode of an invalid credential: %v", err)
	}

	c := &provider.Credential{ID: "c1", Title: "mine", Provider: "files", Team: "t", Value: val}
	stack, err := p.Stack(&provider.BaseStack{Provider: p, StackID: "s1", Team: "t", Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if err := stack.VerifyCredential(ctx, c); err != nil {
		t.Errorf("verify a good credential: %v", err)
	}
	bad := &provider.Credential{ID: "c2", Provider: "files", Value: map[string]any{"dir": dir, "token": "bad"}}
	if err := stack.VerifyCredential(ctx, bad); err == nil || err.Error() != "token rejected by the files cloud" {
		t.Errorf("verify a bad credential: %v, want the provider's reason as is", err)
	}
	ts, err := stack.BootstrapTemplates(ctx, c)
	if err != nil || len(ts) != 1 || ts[0].Key != "boot-c1" || !strings.Contains(string(ts[0].Files["boot.tf"]), filepath.Base(dir)) {
		t.Fatalf("bootstrap templates %+v %v", ts, err)
	}
	if cv, ok := stack.(provider.ConstraintsValidator); !ok {
		t.Error("the proxy stack is not a ConstraintsValidator")
	} else if err := cv.ValidateConstraints(ctx, map[string]any{"memory": 1}); !errors.Is(err, provider.ErrUnsupported) {
		t.Errorf("constraints of a plugin without them: %v, want ErrUnsupported", err)
	}

	// applyTemplate: the agent configs kloud prepared, looked up by the plugin's
	// InjectUserData; other providers' user data withheld and put back.
	c.Bootstrap, err = provider.Decode(p.Schema.NewBootstrap, json.RawMessage(`{"prefix":"pre"}`))
	if err != nil {
		t.Fatal(err)
	}
	zero, one := 0, 1
	ms := []*provider.MachineSpec{
		{ID: "m0", Label: "web.0", Resource: "web", Index: &zero, Provider: "files", KiteID: "agent.0", Owner: "alice"},
		{ID: "m1", Label: "web.1", Resource: "web", Index: &one, Provider: "files", KiteID: "agent.1", Owner: "alice"},
	}
	tpl := &provider.Template{
		Files:     map[string][]byte{"main.tf": []byte("resource \"files_machine\" \"web\" {\n  count = 2\n  user_data = \"echo hi\"\n}\n")},
		Variables: map[string]any{"region": "x", provider.UserDataVar("db"): "key=other-machines-key"},
	}
	configs := map[string]userdata.Config{
		"m0": {Username: "alice", KiteKey: "k0.k0.k0", KontrolURL: "http://k/kite", KlientURL: "http://k/dl", KlientSHA256: strings.Repeat("a", 64), Extra: map[string]any{"locale": "C"}},
		"m1": {Username: "alice", KiteKey: "k1.k1.k1", KontrolURL: "http://k/kite", KlientURL: "http://k/dl", KlientSHA256: strings.Repeat("b", 64)},
	}
	bs := &provider.BaseStack{Provider: p, StackID: "s1", Team: "t", Owner: "alice", Template: tpl, Machines: ms,
		AgentConfig: func(_ context.Context, m *provider.MachineSpec) (userdata.Config, error) { return configs[m.ID], nil }}
	stack, _ = p.Stack(bs)
	out, err := stack.ApplyTemplate(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	sn.mu.Lock()
	gotVars, gotConfigs := sn.variables, sn.configs
	sn.mu.Unlock()
	if !slices.Equal(gotVars, []string{"region"}) {
		t.Errorf("the plugin saw variables %v, want only region (no other provider's user data)", gotVars)
	}
	if got := gotConfigs["m0"]; got.KiteKey != "k0.k0.k0" || got.Extra["locale"] != "C" || got.KlientSHA256 != configs["m0"].KlientSHA256 || got.UserData != "echo hi" || got.Hostname != "web-0" {
		t.Errorf("agent config of m0 in the plugin: %+v", got)
	}
	ud, _ := out.Variables[provider.UserDataVar("web")].([]any)
	if len(ud) != 2 || ud[1] != "key=k1.k1.k1 user=alice host=web-1 script=echo hi" {
		t.Errorf("user data %#v", out.Variables[provider.UserDataVar("web")])
	}
	if out.Variables[provider.UserDataVar("db")] != "key=other-machines-key" || out.Variables["region"] != "x" || out != bs.Template {
		t.Errorf("variables after apply %v", out.Variables)
	}
	if !strings.Contains(string(out.Files["main.tf"]), "var."+provider.UserDataVar("web")) {
		t.Errorf("template not rewritten:\n%s", out.Files["main.tf"])
	}
	if _, err := out.Parsed(); err != nil {
		t.Errorf("rewritten template does not parse: %v", err)
	}

	// Machines: start, info, console log, stop; metadata both ways.
	bm := &provider.BaseMachine{ID: "m0", Label: "web.0", StackID: "s1", Provider: p, KiteID: "agent.0", Owner: "alice",
		Attributes: map[string]any{"id": "m0"}, Meta: map[string]any{"n": 41}, Credential: c}
	m, err := p.Machine(bm)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := m.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mm, _ := meta.(map[string]any); mm["n"] != 42.0 || mm["path"] != filepath.Join(dir, "m0") {
		t.Errorf("start meta %#v", meta)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "m0")); string(b) != "Running" {
		t.Errorf("machine file %q", b)
	}
	state, meta, err := m.Info(ctx)
	if err != nil || state != provider.Running || meta.(map[string]any)["instance"] != "a" {
		t.Errorf("info %v %v %v", state, meta, err)
	}
	if log, err := m.(provider.ConsoleLogger).ConsoleLog(ctx); err != nil || log != "console: Running" {
		t.Errorf("console log %q %v", log, err)
	}
	if _, err := m.(provider.Resizer).Resize(ctx, 1024, 1); !errors.Is(err, provider.ErrUnsupported) {
		t.Errorf("resize: %v, want ErrUnsupported", err)
	}
	fw := m.(provider.Firewaller)
	rule := provider.PortRule{Port: 8000, Protocol: "tcp", From: "team"}
	if rules, err := fw.OpenPorts(ctx, []provider.PortRule{rule}); err != nil || !slices.Equal(rules, []provider.PortRule{rule}) {
		t.Errorf("open ports over the wire: %v %v", rules, err)
	}
	if rules, err := fw.Ports(ctx); err != nil || !slices.Equal(rules, []provider.PortRule{rule}) {
		t.Errorf("ports over the wire: %v %v", rules, err)
	}
	if rules, err := fw.ClosePorts(ctx, []provider.PortRule{rule}); err != nil || len(rules) != 0 {
		t.Errorf("close ports over the wire: %v %v", rules, err)
	}
	if _, err := m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if state, _, _ := m.Info(ctx); state != provider.Stopped {
		t.Errorf("after stop: %s", state)
	}
	// The plugin's own ErrUnsupported crosses the wire.
	bm.Attributes["noStop"] = true
	_, err = m.Stop(ctx)
	if !errors.Is(err, provider.ErrUnsupported) || !strings.Contains(err.Error(), "machine web.0 cannot stop") {
		t.Errorf("stop refused by the plugin: %v", err)
	}
	m1, _ := p.Machine(&provider.BaseMachine{ID: "m1", Provider: p, Credential: c})
	if state, _, err := m1.Info(ctx); err != nil || state != provider.NotInitialized {
		t.Errorf("info of a machine never built: %v %v", state, err)
	}

	// Available.
	if err := p.Available(); err != nil {
		t.Errorf("available: %v", err)
	}
	unavailable.Store("the files cloud is down")
	if err := p.Available(); err == nil || err.Error() != "the files cloud is down" {
		t.Errorf("unavailable: %v", err)
	}

	// HTTP through kloud's /provider/files/.
	req, _ := http.NewRequest("PUT", e.http.URL+provider.HandlerPrefix("files")+"x/y?q=1", strings.NewReader("hello"))
	req.Header.Set("X-Test", "yes")
	req.Header.Set("Cookie", "kloud_session=the-users")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	// The plugin gets no cookie and sets none on kloud's origin.
	if res.StatusCode != http.StatusCreated || res.Header.Get("X-Reply") != "from a" || res.Header.Get("Set-Cookie") != "" ||
		string(body) != "PUT /provider/files/x/y q=1 h=yes c= body=hello" {
		t.Errorf("http: %d %v %q", res.StatusCode, res.Header, body)
	}
	res, err = http.Post(e.http.URL+provider.HandlerPrefix("files"), "application/octet-stream", bytes.NewReader(make([]byte, plugin.MaxHTTPBody+1)))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over %d bytes: %d", plugin.MaxHTTPBody, res.StatusCode)
	}
}

// TestRefusals: what kloud refuses at registration, and how Run reports it.
func TestRefusals(t *testing.T) {
	e := startKloud(t)
	sn := newSeen("a")

	t.Run("in-tree name", func(t *testing.T) {
		_, done := e.run(filesProvider("local", sn, noUnavailable()), e.pluginKey("local"))
		err := runErr(t, done)
		if !errors.Is(err, kite.ErrConflict) || !strings.Contains(err.Error(), "provider local is built into this kloud") {
			t.Errorf("Run: %v", err)
		}
		if p, _ := e.reg.Lookup("local"); p.ResourceType != "kloudlocal_machine" {
			t.Error("the in-tree provider was replaced")
		}
	})
	t.Run("in-tree resource type", func(t *testing.T) {
		p := filesProvider("sneaky", sn, noUnavailable())
		p.ResourceType = "kloudlocal_machine"
		err := runErr(t, second(e.run(p, e.pluginKey("sneaky"))))
		if !errors.Is(err, kite.ErrConflict) || !strings.Contains(err.Error(), "resource type kloudlocal_machine is provider local's") {
			t.Errorf("Run: %v", err)
		}
	})
	t.Run("key of another provider", func(t *testing.T) {
		err := runErr(t, second(e.run(filesProvider("files", sn, noUnavailable()), e.pluginKey("other"))))
		if !errors.Is(err, kite.ErrPermission) || !strings.Contains(err.Error(), `this plugin key is for provider "other", not "files"`) {
			t.Errorf("Run: %v", err)
		}
	})
	t.Run("wrong key kind", func(t *testing.T) {
		user, _ := e.signer.KiteKey("alice", "k1", e.url)
		agent, _ := e.signer.AgentKey(kitekey.AgentKeySpec{Owner: "alice", MachineID: "m1", KiteID: "agent.x", KontrolURL: e.url})
		sess, _ := e.signer.Session("admin", true, time.Hour)
		for name, key := range map[string]string{"user kite key": user, "agent key": agent, "admin session": sess} {
			err := runErr(t, second(e.run(filesProvider("files", sn, noUnavailable()), key)))
			if !errors.Is(err, kite.ErrAuth) || !errors.Is(err, kite.ErrAuth) || !strings.Contains(err.Error(), "wrong kind of credential") {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
	t.Run("version mismatch", func(t *testing.T) {
		c := dial(t, e, e.pluginKey("files"))
		m, err := plugin.ManifestOf(filesProvider("files", sn, noUnavailable()))
		if err != nil {
			t.Fatal(err)
		}
		err = c.Call(t.Context(), plugin.MethodRegister, &plugin.RegisterParams{Versions: []int{2, 3}, Provider: *m}, nil)
		if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "plugin speaks plugin API versions [2 3], kloud speaks [1]") {
			t.Errorf("register v2: %v", err)
		}
		if _, err := e.reg.Lookup("files"); err == nil {
			t.Error("a refused plugin is in the registry")
		}
		// And the version both speak is chosen when there is one.
		var res plugin.RegisterResult
		if err := c.Call(t.Context(), plugin.MethodRegister, &plugin.RegisterParams{Versions: []int{1, 2}, Provider: *m}, &res); err != nil || res.Version != 1 || res.KloudVersion != "test-1" {
			t.Errorf("register [1 2]: %+v %v", res, err)
		}
	})
	t.Run("invalid manifest", func(t *testing.T) {
		c := dial(t, e, e.pluginKey("files"))
		m, _ := plugin.ManifestOf(filesProvider("files", sn, noUnavailable()))
		m.Capabilities = append(m.Capabilities, "teleport")
		err := c.Call(t.Context(), plugin.MethodRegister, &plugin.RegisterParams{Versions: []int{1}, Provider: *m}, nil)
		if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), `unknown capability "teleport"`) {
			t.Errorf("register: %v", err)
		}
	})
	t.Run("schema that does not compile", func(t *testing.T) {
		// pluginapi checks a schema's header only; the host compiles it.
		c := dial(t, e, e.pluginKey("files"))
		m, _ := plugin.ManifestOf(filesProvider("files", sn, noUnavailable()))
		m.Schemas[provider.PartCredential] = json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"a":{"type":"strin"}}}`)
		err := c.Call(t.Context(), plugin.MethodRegister, &plugin.RegisterParams{Versions: []int{1}, Provider: *m}, nil)
		if !errors.Is(err, kite.ErrInvalidParams) || !strings.Contains(err.Error(), "provider.schemas.credential") {
			t.Errorf("register: %v", err)
		}
	})
	t.Run("plugin key calls a user method", func(t *testing.T) {
		c := dial(t, e, e.pluginKey("files"))
		for _, m := range []string{"stack.list", "kite.methods", "kite.systemInfo"} {
			err := c.Call(t.Context(), m, nil, nil)
			if !errors.Is(err, kite.ErrPermission) || !strings.Contains(err.Error(), "plugin keys may only call the plugin-facing methods") {
				t.Errorf("%s: %v", m, err)
			}
		}
	})
	t.Run("user calls plugin.register", func(t *testing.T) {
		user, _ := e.signer.KiteKey("alice", "k2", e.url)
		c := dialAuth(t, e, kite.Auth{Type: kite.AuthKiteKey, Key: user})
		err := c.Call(t.Context(), plugin.MethodRegister, &plugin.RegisterParams{Versions: []int{1}}, nil)
		if !errors.Is(err, kite.ErrPermission) || !strings.Contains(err.Error(), "needs a plugin key") {
			t.Errorf("register as a user: %v", err)
		}
	})
}

func second[A, B any](_ A, b B) B { return b }

func dial(t *testing.T, e *kloudEnv, key string) *kite.Conn {
	return dialAuth(t, e, kite.Auth{Type: kitekey.KindPluginKey, Key: key})
}

func dialAuth(t *testing.T, e *kloudEnv, a kite.Auth) *kite.Conn {
	t.Helper()
	k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "test"}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	c, err := k.Dial(t.Context(), e.url, a)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestConnection: reconnects, disconnects, replacement.
func TestConnection(t *testing.T) {
	e := startKloud(t)
	sn := newSeen("a")
	stop, _ := e.run(filesProvider("files", sn, noUnavailable()), e.pluginKey("files"))
	e.wait("files")
	p, _ := e.reg.Lookup("files")
	dir := t.TempDir()
	c := &provider.Credential{ID: "c1", Value: map[string]any{"dir": dir, "token": "good"}}
	info := func() (provider.State, error) {
		pp, err := e.reg.Lookup("files")
		if err != nil {
			return "", err
		}
		m, _ := pp.Machine(&provider.BaseMachine{ID: "m0", Provider: pp, Credential: c})
		st, _, err := m.Info(t.Context())
		return st, err
	}
	if st, err := info(); err != nil || st != provider.NotInitialized {
		t.Fatalf("info: %v %v", st, err)
	}

	t.Run("kloud drops the connection", func(t *testing.T) {
		before := e.status("files").ConnectedAt
		for _, c := range e.kite.Conns() {
			t.Logf("closing the connection from %s", c.Remote())
			c.Close(errors.New("test drops every connection"))
		}
		testutil.Eventually(t, 10*time.Second, func() bool {
			s := e.status("files")
			return s.Connected && s.ConnectedAt.After(before)
		}, "the plugin did not reconnect and register again: %+v", e.status("files"))
		if st, err := info(); err != nil || st != provider.NotInitialized {
			t.Fatalf("info after reconnect: %v %v", st, err)
		}
		// Served counts the connection begun after a time, not time before it.
		if d := e.host.Served("files", before); d <= 0 {
			t.Errorf("Served since the reconnect: %s", d)
		}
		if d := e.host.Served("files", time.Now().Add(time.Second)); d != 0 {
			t.Errorf("Served since a time after the last connection: %s, want 0", d)
		}
		if d := e.host.Served("nosuch", before); d != 0 {
			t.Errorf("Served of an unknown plugin: %s", d)
		}
	})

	t.Run("disconnect mid-call", func(t *testing.T) {
		m, _ := p.Machine(&provider.BaseMachine{ID: "slow", Provider: p, Credential: c, Attributes: map[string]any{"slow": true}})
		errc := make(chan error, 1)
		go func() { _, err := m.Start(t.Context()); errc <- err }()
		select {
		case <-sn.startIn:
		case <-time.After(10 * time.Second):
			t.Fatal("the slow start never reached the plugin")
		}
		for _, c := range e.kite.Conns() {
			c.Close(errors.New("test drops every connection"))
		}
		start := time.Now()
		select {
		case err := <-errc:
			if !errors.Is(err, kite.ErrUnavailable) || !strings.Contains(err.Error(), "provider files (plugin) disconnected during machine.start") {
				t.Errorf("start: %v", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the call failed %s after the disconnect", d)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call in flight did not fail when the connection dropped")
		}
		e.wait("files")
	})

	// Issue 23 (chaos plugin-apply): a call made while the plugin is down (killed, and being
	// restarted) waits for it and goes to the new one, instead of failing at once.
	t.Run("a call waits for the plugin coming back", func(t *testing.T) {
		stop()
		testutil.Eventually(t, 10*time.Second, func() bool { return !e.status("files").Connected }, "still connected")
		type res struct {
			st  provider.State
			err error
		}
		// A probe (readyz, provider list) says what is now, without waiting.
		if err := p.Available(); !errors.Is(err, kite.ErrUnavailable) || strings.Contains(err.Error(), "down for over") {
			t.Errorf("Available while the plugin is down: %v", err)
		}
		resc := make(chan res, 1)
		go func() { st, err := info(); resc <- res{st, err} }()
		select {
		case r := <-resc:
			t.Fatalf("a call to a plugin that is down returned before it came back: %v %v", r.st, r.err)
		case <-time.After(300 * time.Millisecond):
		}
		back := time.Now()
		stop, _ = e.run(filesProvider("files", newSeen("back"), noUnavailable()), e.pluginKey("files"))
		select {
		case r := <-resc:
			if r.err != nil || r.st != provider.NotInitialized {
				t.Fatalf("the call made while the plugin was down: %v %v", r.st, r.err)
			}
			t.Logf("answered %s after the plugin was started again", time.Since(back).Round(time.Millisecond))
		case <-time.After(30 * time.Second):
			t.Fatal("the call made while the plugin was down never returned")
		}
	})

	t.Run("plugin stops", func(t *testing.T) {
		stop()
		testutil.Eventually(t, 10*time.Second, func() bool { return !e.status("files").Connected }, "still connected")
		// Waited for up to RestartWait (2s here), then the clear error; after that at once.
		_, err := info()
		if !errors.Is(err, kite.ErrUnavailable) || !strings.Contains(err.Error(), "provider files (plugin) is not connected: connection closed (down for over 2s)") {
			t.Errorf("info while disconnected: %v", err)
		}
		start := time.Now()
		if _, err := info(); !errors.Is(err, kite.ErrUnavailable) {
			t.Errorf("info while disconnected, again: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("a call to a plugin down for over RestartWait took %s", d)
		}
		e.host.SetError("files", errors.New("exit status 2"))
		if _, err := info(); err == nil || !strings.Contains(err.Error(), "is not connected: exit status 2") {
			t.Errorf("info quotes the supervisor's error: %v", err)
		}
		if s := e.status("files"); s.Connected || s.LastError != "exit status 2" || s.DisconnectedAt.IsZero() {
			t.Errorf("status %+v", s)
		}
		if _, err := e.reg.Lookup("files"); err != nil {
			t.Errorf("the proxy left the registry: %v", err)
		}
	})

	t.Run("second registration replaces the first", func(t *testing.T) {
		snA, snB := newSeen("a"), newSeen("b")
		_, doneA := e.run(filesProvider("files", snA, noUnavailable()), e.pluginKey("files"))
		e.wait("files")
		if _, meta, _ := infoMeta(t, e, c); meta["instance"] != "a" {
			t.Fatalf("first plugin not serving: %v", meta)
		}
		e.run(filesProvider("files", snB, noUnavailable()), e.pluginKey("files"))
		err := runErr(t, doneA)
		if !strings.Contains(err.Error(), "replaced") {
			t.Errorf("the replaced plugin's Run: %v", err)
		}
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, meta, err := infoMeta(t, e, c)
			return err == nil && meta["instance"] == "b"
		}, "the second plugin does not serve")
		if s := e.status("files"); !s.Connected {
			t.Errorf("status %+v", s)
		}
	})

	t.Run("expected plugin", func(t *testing.T) {
		e.host.Expect("later", "launched (pid 42)")
		s := e.status("later")
		if s.Connected || s.Where != "launched (pid 42)" {
			t.Errorf("status %+v", s)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if err := e.host.Wait(ctx, "later"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("wait: %v", err)
		}
		e.run(filesProvider("later", newSeen("l"), noUnavailable()), e.pluginKey("later"))
		e.wait("later")
		if s := e.status("later"); !s.Connected || s.Where != "launched (pid 42)" {
			t.Errorf("status %+v", s)
		}
	})
}

func infoMeta(t *testing.T, e *kloudEnv, c *provider.Credential) (provider.State, map[string]any, error) {
	p, err := e.reg.Lookup("files")
	if err != nil {
		return "", nil, err
	}
	m, _ := p.Machine(&provider.BaseMachine{ID: "m0", Provider: p, Credential: c})
	st, meta, err := m.Info(t.Context())
	mm, _ := meta.(map[string]any)
	return st, mm, err
}

// TestRegistrationLoop: a holder of a plugin key who dials and registers in a tight loop, 200
// times over 8 connections, some registering again on a connection they already registered on,
// some dropped right after. kloud ends with one registration (the last, served), every other
// connection closed, no goroutine or connection left behind, and the real plugin's calls still
// answered.
func TestRegistrationLoop(t *testing.T) {
	e := startKloud(t)
	sn := newSeen("a")
	m, err := plugin.ManifestOf(filesProvider("files", sn, noUnavailable()))
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	key := e.pluginKey("files")
	var wg sync.WaitGroup
	var registered, refused atomic.Int64
	var whyMu sync.Mutex
	why := map[string]int{} // the refusals, by message
	refuse := func(err error) {
		refused.Add(1)
		msg := err.Error()
		if i := strings.IndexAny(msg, "0123456789"); i > 40 {
			msg = msg[:i] // without the addresses
		}
		whyMu.Lock()
		why[msg]++
		whyMu.Unlock()
	}
	for w := range 8 {
		wg.Go(func() {
			k, err := kite.New(kite.Options{Identity: kite.Identity{Name: "hostile"}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Error(err)
				return
			}
			defer k.Close()
			for i := range 25 {
				c, err := k.Dial(t.Context(), e.url, kite.Auth{Type: kitekey.KindPluginKey, Key: key})
				if err != nil {
					refuse(err)
					continue
				}
				for range 1 + (w+i)%2 { // every other connection registers twice
					if err := c.Call(t.Context(), plugin.MethodRegister, &plugin.RegisterParams{Versions: []int{1}, Provider: *m}, nil); err != nil {
						refuse(err)
					} else {
						registered.Add(1)
					}
				}
				if i%3 == 0 {
					c.Close(nil) // dropped at once; the others stay until replaced
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d registrations answered, %d refused or cut by a newer one: %v", registered.Load(), refused.Load(), why)
	if registered.Load() == 0 {
		t.Fatal("no registration was answered")
	}
	for msg := range why { // a registration fails only because a newer one closed its connection
		if !strings.Contains(msg, "connection closed") {
			t.Errorf("a registration refused otherwise: %s", msg)
		}
	}
	// The real plugin registers last: it is the one served.
	e.run(filesProvider("files", sn, noUnavailable()), key)
	testutil.Eventually(t, 20*time.Second, func() bool {
		s := e.status("files")
		return s.Connected && len(e.kite.Conns()) == 1
	}, "kloud did not settle on one connection: %d open, %+v", len(e.kite.Conns()), e.status("files"))
	c := &provider.Credential{ID: "c1", Value: map[string]any{"dir": t.TempDir(), "token": "good"}}
	if _, meta, err := infoMeta(t, e, c); err != nil || meta["instance"] != "a" {
		t.Fatalf("a call after the loop: %v %v", meta, err)
	}
	if n := len(e.host.Status()); n != 1 {
		t.Errorf("%d plugins in the host's status, want 1", n)
	}
	// Goroutines: the loop's connections are gone (the real plugin and its connection add a few).
	testutil.Eventually(t, 20*time.Second, func() bool { return runtime.NumGoroutine() < before+40 },
		"goroutines: %d before the loop, %d after", before, runtime.NumGoroutine())
}

// TestTerraformProviders: the Terraform providers a plugin offers reach kloud's template policy
// (declared ones, or derived from the resource type), and a manifest cannot offer remote state.
func TestTerraformProviders(t *testing.T) {
	e := startKloud(t)
	p := filesProvider("files", newSeen("a"), noUnavailable())
	provider.DeclareTerraform(p, provider.TerraformProvider{Name: "files", Source: "example/files", ProviderArgs: []string{"root"}})
	e.run(p, e.pluginKey("files"))
	e.wait("files")
	pol := e.reg.TemplatePolicy()
	var got *provider.TerraformProvider
	for i := range pol.Providers {
		if pol.Providers[i].Name == "files" {
			got = &pol.Providers[i]
		}
	}
	if got == nil || got.Source != "example/files" || !slices.Equal(got.ProviderArgs, []string{"root"}) {
		t.Fatalf("policy providers %+v: want the plugin's declared files provider", pol.Providers)
	}

	m, err := plugin.ManifestOf(filesProvider("other", newSeen("b"), noUnavailable()))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.TerraformProviders) != 1 || m.TerraformProviders[0].Name != "other" || m.TerraformProviders[0].Source != "kloud/other" {
		t.Errorf("derived terraform providers %+v", m.TerraformProviders)
	}
	m.TerraformProviders = []plugin.TerraformProvider{{Name: "terraform", Types: []string{"terraform_data", "terraform_remote_state"}}}
	if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "terraform_remote_state") {
		t.Errorf("remote state offered: %v", err)
	}
}
