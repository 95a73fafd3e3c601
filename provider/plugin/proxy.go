package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/provider"
)

// newProxy builds the *provider.Provider kloud uses for plugin name: the manifest's data, a
// Schema built from its field lists, and Stack/Machine/Available/Decoder/Handler that call the
// plugin over its current connection.
func (h *Host) newProxy(name string, m Manifest) *provider.Provider {
	caps := slices.Clone(m.Capabilities)
	if caps == nil {
		caps = []provider.Capability{} // explicit: nothing beyond what every provider does
	}
	p := &provider.Provider{
		Name: name, ResourceType: m.ResourceType, UserDataAttr: m.UserDataAttr, NoCloudInit: m.NoCloudInit,
		Description: m.Description, Capabilities: caps, Kind: provider.KindPlugin, Constraints: proxyConstraints(m.Constraints),
		Schema: provider.Schema{
			NewCredential: dynamicType(m.Fields, partCredential),
			NewBootstrap:  dynamicType(m.Fields, partBootstrap),
			NewMetadata:   dynamicType(m.Fields, partMetadata),
		},
	}
	if m.Schemas != nil {
		// The plugin's own JSON Schemas (enum, bounds, immutable, ...) are what kloud describes
		// and validates against; the field lists' types above only open stored values.
		p.Schema.JSON = map[string]json.RawMessage{}
		for part, s := range m.Schemas {
			if s != nil && string(s) != "null" {
				p.Schema.JSON[part] = s
			}
		}
	}
	can := func(c provider.Capability) bool { return slices.Contains(caps, c) }
	p.Stack = func(b *provider.BaseStack) (provider.Stack, error) {
		return &proxyStack{h: h, name: name, b: b, can: can}, nil
	}
	p.Machine = func(b *provider.BaseMachine) (provider.Machine, error) {
		return &proxyMachine{h: h, name: name, b: b, can: can}, nil
	}
	p.Available = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), h.o.AvailableTimeout)
		defer cancel()
		ctx = context.WithValue(ctx, noWait{}, true) // a probe (readyz, provider list): what is now
		var res availableResult
		if err := h.call(ctx, name, MethodAvailable, struct{}{}, &res); err != nil {
			return err
		}
		if res.Unavailable != "" {
			return errors.New(res.Unavailable)
		}
		return nil
	}
	p.Decoder = func(ctx context.Context, part string, raw, old json.RawMessage) (json.RawMessage, error) {
		var res decodeResult
		if err := h.call(ctx, name, MethodDecode, &decodeParams{Part: part, Raw: raw, Old: old}, &res); err != nil {
			return nil, err
		}
		return res.Value, nil
	}
	if m.Handler {
		p.Handler = &proxyHandler{h: h, name: name}
	}
	h.setInventory(p, name, can) // resources.go
	h.setBuckets(p, name, can)   // bucket.go
	if len(m.TerraformProviders) > 0 {
		tps := make([]provider.TerraformProvider, len(m.TerraformProviders))
		for i, tp := range m.TerraformProviders {
			tps[i] = provider.TerraformProvider{Name: tp.Name, Source: tp.Source, Types: tp.Types, ProviderArgs: tp.ProviderArgs}
		}
		provider.DeclareTerraform(p, tps...)
	}
	return p
}

// dynamicType returns a constructor of a struct type with the fields of part (nil if the plugin
// has no such part), tagged like an in-tree provider's (json, kloud, default), so that kloud's
// provider.Fields, SecretFields and Decode treat a plugin's credential like an in-tree one's. The
// plugin still decodes it with its own type (and Valid) when it uses it.
func dynamicType(fields map[string][]provider.Field, part string) func() any {
	fs, ok := fields[part]
	if !ok {
		return nil
	}
	sf := make([]reflect.StructField, 0, len(fs))
	for i, f := range fs {
		var typ reflect.Type
		switch f.Type {
		case "integer":
			typ = reflect.TypeFor[int64]()
		case "number":
			typ = reflect.TypeFor[float64]()
		case "boolean":
			typ = reflect.TypeFor[bool]()
		default:
			typ = reflect.TypeFor[string]()
		}
		label := strings.ReplaceAll(f.Label, ",", " ")
		if label == "" {
			label = f.Name
		}
		kloud := label
		if f.Secret {
			kloud += ",secret"
		}
		if f.Required {
			kloud += ",required"
		}
		tag := "json:" + strconv.Quote(f.Name) + " kloud:" + strconv.Quote(kloud)
		if f.Default != "" {
			tag += " default:" + strconv.Quote(f.Default)
		}
		sf = append(sf, reflect.StructField{Name: "F" + strconv.Itoa(i), Type: typ, Tag: reflect.StructTag(tag)})
	}
	t := reflect.StructOf(sf)
	return func() any { return reflect.New(t).Interface() }
}

// proxyStack is a plugin's provider.Stack in kloud. It implements ConstraintsValidator, which
// returns provider.ErrUnsupported unless the plugin advertised CapConstraints.
type proxyStack struct {
	h    *Host
	name string
	b    *provider.BaseStack
	can  func(provider.Capability) bool
}

var (
	_ provider.Stack                = (*proxyStack)(nil)
	_ provider.ConstraintsValidator = (*proxyStack)(nil)
	_ provider.Machine              = (*proxyMachine)(nil)
	_ provider.ConsoleLogger        = (*proxyMachine)(nil)
	_ provider.Resizer              = (*proxyMachine)(nil)
)

func (s *proxyStack) params(c *provider.Credential) (*stackParams, error) {
	cred, err := toWireCredential(c)
	if err != nil {
		return nil, err
	}
	b := s.b
	p := &stackParams{Stack: wireStack{StackID: b.StackID, Team: b.Team, Owner: b.Owner, Vacating: b.Vacating}, Credential: cred}
	for _, m := range b.Machines {
		p.Stack.Machines = append(p.Stack.Machines, toWireSpec(m))
	}
	return p, nil
}

func (s *proxyStack) VerifyCredential(ctx context.Context, c *provider.Credential) error {
	p, err := s.params(c)
	if err != nil {
		return err
	}
	return s.h.call(ctx, s.name, MethodVerifyCredential, p, nil)
}

func (s *proxyStack) BootstrapTemplates(ctx context.Context, c *provider.Credential) ([]*provider.Template, error) {
	p, err := s.params(c)
	if err != nil {
		return nil, err
	}
	var res templatesResult
	if err := s.h.call(ctx, s.name, MethodBootstrapTemplates, p, &res); err != nil {
		return nil, err
	}
	out := make([]*provider.Template, 0, len(res.Templates))
	for i := range res.Templates {
		out = append(out, res.Templates[i].template())
	}
	return out, nil
}

// ApplyTemplate sends the stack's template and the agent configuration of each of this
// provider's machines (kloud already minted their keys; AgentConfig is a lookup), and takes the
// plugin's rewrite. The rendered user data of other providers' machines (which hold their agent
// keys) is withheld from the plugin and put back after.
func (s *proxyStack) ApplyTemplate(ctx context.Context, c *provider.Credential) (*provider.Template, error) {
	b := s.b
	if b.Template == nil {
		return nil, fmt.Errorf("provider %s: no template to apply", s.name)
	}
	p, err := s.params(c)
	if err != nil {
		return nil, err
	}
	own := map[string]bool{}
	p.Stack.AgentConfigs = map[string]wireAgentConfig{}
	for _, m := range b.Machines {
		own[provider.UserDataVar(m.Resource)] = true
		if b.AgentConfig == nil {
			continue
		}
		ac, err := b.AgentConfig(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("machine %s: %w", m.Label, err)
		}
		p.Stack.AgentConfigs[m.ID] = toWireAgentConfig(ac)
	}
	withheld := map[string]any{}
	sent := map[string]any{}
	for k, v := range b.Template.Variables {
		if strings.HasPrefix(k, provider.UserDataVar("")) && !own[k] {
			withheld[k] = v
		} else {
			sent[k] = v
		}
	}
	p.Stack.Template = &wireTemplate{Key: b.Template.Key, Files: b.Template.Files, Variables: sent}
	var res templateResult
	if err := s.h.call(ctx, s.name, MethodApplyTemplate, p, &res); err != nil {
		return nil, err
	}
	if len(res.Template.Files) == 0 {
		return nil, fmt.Errorf("provider %s (plugin) returned a template without files", s.name)
	}
	vars := res.Template.Variables
	if vars == nil {
		vars = map[string]any{}
	}
	for k, v := range withheld {
		vars[k] = v
	}
	b.Template.Key, b.Template.Files, b.Template.Variables, b.Template.Config = res.Template.Key, res.Template.Files, vars, nil
	return b.Template, nil
}

func (s *proxyStack) ValidateConstraints(ctx context.Context, attrs map[string]any) error {
	if !s.can(provider.CapConstraints) {
		return fmt.Errorf("provider %s: validate constraints: %w", s.name, provider.ErrUnsupported)
	}
	p, err := s.params(nil)
	if err != nil {
		return err
	}
	p.Attributes = attrs
	return s.h.call(ctx, s.name, MethodValidateConstraints, p, nil)
}

// proxyMachine is a plugin's provider.Machine in kloud. It implements ConsoleLogger and
// Resizer, which return provider.ErrUnsupported unless the plugin advertised the capability.
type proxyMachine struct {
	h    *Host
	name string
	b    *provider.BaseMachine
	can  func(provider.Capability) bool
}

func (m *proxyMachine) params() (*machineParams, error) {
	w, err := toWireMachine(m.b)
	if err != nil {
		return nil, err
	}
	return &machineParams{Machine: w}, nil
}

func decodeMeta(raw json.RawMessage) (any, error) {
	if isNull(raw) {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("machine metadata from the plugin: %w", err)
	}
	return v, nil
}

func (m *proxyMachine) power(ctx context.Context, method string) (any, error) {
	p, err := m.params()
	if err != nil {
		return nil, err
	}
	var res metaResult
	if err := m.h.call(ctx, m.name, method, p, &res); err != nil {
		return nil, err
	}
	return decodeMeta(res.Meta)
}

func (m *proxyMachine) Start(ctx context.Context) (any, error) {
	return m.power(ctx, MethodMachineStart)
}
func (m *proxyMachine) Stop(ctx context.Context) (any, error) { return m.power(ctx, MethodMachineStop) }

func (m *proxyMachine) Info(ctx context.Context) (provider.State, any, error) {
	p, err := m.params()
	if err != nil {
		return provider.Unknown, nil, err
	}
	var res infoResult
	if err := m.h.call(ctx, m.name, MethodMachineInfo, p, &res); err != nil {
		return provider.Unknown, nil, err
	}
	meta, err := decodeMeta(res.Meta)
	return res.State, meta, err
}

func (m *proxyMachine) ConsoleLog(ctx context.Context) (string, error) {
	if !m.can(provider.CapConsoleLog) {
		return "", fmt.Errorf("provider %s: console log: %w", m.name, provider.ErrUnsupported)
	}
	p, err := m.params()
	if err != nil {
		return "", err
	}
	var res consoleLogResult
	if err := m.h.call(ctx, m.name, MethodMachineConsoleLog, p, &res); err != nil {
		return "", err
	}
	return res.Log, nil
}

func (m *proxyMachine) Resize(ctx context.Context, memoryMB int, cpus float64) (any, error) {
	if !m.can(provider.CapResize) {
		return nil, fmt.Errorf("provider %s: resize: %w", m.name, provider.ErrUnsupported)
	}
	p, err := m.params()
	if err != nil {
		return nil, err
	}
	p.MemoryMB, p.CPUs = memoryMB, cpus
	var res metaResult
	if err := m.h.call(ctx, m.name, MethodMachineResize, p, &res); err != nil {
		return nil, err
	}
	return decodeMeta(res.Meta)
}

// proxyHandler is a plugin's Provider.Handler in kloud: each request (body at most MaxHTTPBody)
// goes to the plugin as provider.http and the plugin's response is replayed. Streaming and
// upgrades are not supported.
type proxyHandler struct {
	h    *Host
	name string
}

// hopHeaders are per-connection headers that are not forwarded either way.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func (ph *proxyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxHTTPBody))
	if err != nil {
		http.Error(w, fmt.Sprintf("request body: %v (at most %d bytes)", err, MaxHTTPBody), http.StatusRequestEntityTooLarge)
		return
	}
	hdr := r.Header.Clone()
	for _, k := range hopHeaders {
		hdr.Del(k)
	}
	hdr.Del("Cookie") // a user's session never reaches a plugin
	var res httpResult
	err = ph.h.call(r.Context(), ph.name, MethodHTTP, &httpParams{Method: r.Method, URL: r.URL.RequestURI(), Header: hdr, Body: body,
		Host: r.Host, RemoteAddr: r.RemoteAddr}, &res)
	if err != nil {
		code := http.StatusBadGateway
		if errors.Is(err, kite.ErrUnavailable) {
			code = http.StatusServiceUnavailable
		}
		http.Error(w, err.Error(), code)
		return
	}
	if res.Status < 100 || res.Status > 999 {
		http.Error(w, fmt.Sprintf("provider %s (plugin) answered with status %d", ph.name, res.Status), http.StatusBadGateway)
		return
	}
	for k, vs := range res.Header {
		// No hop-by-hop headers, and no cookies on kloud's origin from third-party code.
		if ck := http.CanonicalHeaderKey(k); slices.Contains(hopHeaders, ck) || ck == "Set-Cookie" {
			continue
		}
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(res.Status)
	w.Write(res.Body)
}
