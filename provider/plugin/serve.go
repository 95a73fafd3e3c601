package plugin

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"reflect"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kloud-dev/kloud/kite"
	"github.com/kloud-dev/kloud/kite/kitekey"
	"github.com/kloud-dev/kloud/provider"
	"github.com/kloud-dev/kloud/userdata"
)

// Options configure Run. Zero fields take the documented defaults.
type Options struct {
	// URL is kloud's kite URL (ws://host:port/kite or http://host:port/kite). Default: $KLOUD_PLUGIN_URL.
	URL string
	// Key is the plugin key. Default: $KLOUD_PLUGIN_KEY, else the contents of the file named by
	// $KLOUD_PLUGIN_KEY_FILE.
	Key string
	// Version is the plugin's own version, shown by `kloud provider list`. Default: the
	// provider's Version field, else the main module's version from the build info ("" for a
	// development build).
	Version string
	// TLSConfig is what the plugin trusts for a wss:// URL. Default: the system's roots, plus
	// the PEM of $KLOUD_PLUGIN_CA, checking the name $KLOUD_PLUGIN_TLS_SERVER_NAME if set.
	TLSConfig *tls.Config
	// Logger. Default: text to stderr (a launched plugin's stderr goes to kloud's log).
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the wait between reconnection attempts (defaults 100ms
	// and 5s, with jitter).
	MinBackoff, MaxBackoff time.Duration
}

func (o *Options) defaults() error {
	if o.URL == "" {
		o.URL = os.Getenv(EnvURL)
	}
	if o.Key == "" {
		o.Key = strings.TrimSpace(os.Getenv(EnvKey))
	}
	if o.Key == "" {
		if f := os.Getenv(EnvKeyFile); f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("plugin key: %w", err)
			}
			o.Key = strings.TrimSpace(string(b))
		}
	}
	switch {
	case o.URL == "":
		return fmt.Errorf("no kloud URL: set %s or pass --url (kloud's kite URL, e.g. http://127.0.0.1:7000/kite)", EnvURL)
	case o.Key == "":
		return fmt.Errorf("no plugin key: set %s or %s, or pass --key-file (mint one with `kloud key create --provider NAME`)", EnvKey, EnvKeyFile)
	}
	if o.Version == "" {
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "(devel)" {
			o.Version = bi.Main.Version
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if ca, name := os.Getenv(EnvCA), os.Getenv(EnvServerName); o.TLSConfig == nil && (ca != "" || name != "") {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if ca != "" && !pool.AppendCertsFromPEM([]byte(ca)) {
			return fmt.Errorf("%s holds no PEM certificate", EnvCA)
		}
		o.TLSConfig = &tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12}
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 5 * time.Second
	}
	return nil
}

// Serve is a plugin's main: it runs p until SIGINT or SIGTERM, with Options from the
// environment and the command line (-url, -key-file, -version), and exits non-zero on an error
// (kloud refused the plugin, or the options are incomplete). -manifest prints what the plugin
// would register (its name, capabilities, schemas) as JSON and exits.
//
//	func main() { plugin.Serve(myprovider.Provider) }
func Serve(p *provider.Provider) {
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	var o Options
	fs.StringVar(&o.URL, "url", "", "kloud's kite URL, e.g. http://127.0.0.1:7000/kite (default $"+EnvURL+")")
	keyFile := fs.String("key-file", "", "file holding the plugin key (default $"+EnvKey+" or the file $"+EnvKeyFile+")")
	fs.StringVar(&o.Version, "version", "", "the plugin's version (default: from the build info)")
	manifest := fs.Bool("manifest", false, "print the provider's manifest as JSON and exit")
	fs.Parse(os.Args[1:])
	if *manifest {
		m, err := ManifestOf(p)
		if err == nil {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(m)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "kloud-provider:", err)
			os.Exit(1)
		}
		return
	}
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kloud-provider:", err)
			os.Exit(2)
		}
		o.Key = strings.TrimSpace(string(b))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, p, o); err != nil {
		name := "?"
		if p != nil {
			name = p.Name
		}
		fmt.Fprintf(os.Stderr, "kloud-provider-%s: %v\n", name, err)
		stop()
		os.Exit(1)
	}
}

// Run serves p to the kloud at o.URL until ctx ends (then it returns nil): it dials kloud's kite
// with the plugin key, calls plugin.register with p's manifest, and serves kloud's calls on that
// connection. A lost connection is dialed again with backoff and registered again. Run returns
// an error at once for a refusal retrying cannot cure: a rejected key (-32001), a key for another
// provider or a name kloud has built in (-32002, -32004), an API version kloud does not speak or
// an invalid manifest (-32602).
func Run(ctx context.Context, p *provider.Provider, o Options) error {
	m, err := ManifestOf(p)
	if err != nil {
		return err
	}
	if o.Version == "" {
		o.Version = p.Version
	}
	if err := o.defaults(); err != nil {
		return err
	}
	if p.UserDataAttr == "" && !p.NoCloudInit {
		p.UserDataAttr = "user_data" // as provider.Registry.Register does in kloud
	}
	log := o.Logger.With("provider", p.Name)
	ver := o.Version
	if ver == "" || strings.Contains(ver, "/") || len(ver) > 128 {
		ver = "0.0.0"
	}
	k, err := kite.New(kite.Options{
		Identity:       kite.Identity{Name: "kloud-provider-" + p.Name, Version: ver, Username: "provider-" + p.Name},
		Logger:         log,
		HandlerTimeout: time.Hour, // kloud's own deadline governs; this only catches a handler that never returns
		TLSConfig:      o.TLSConfig,
	})
	if err != nil {
		return fmt.Errorf("plugin %s: %w", p.Name, err)
	}
	defer k.Close()
	(&server{p: p, log: log}).handle(k)

	fatal := make(chan error, 1)
	giveUp := func(err error) {
		select {
		case fatal <- err:
		default:
		}
	}
	var replaced atomic.Bool
	k.HandleNotification(notifyReplaced, func(_ *kite.Conn, params []byte) {
		var p replacedParams
		json.Unmarshal(params, &p)
		replaced.Store(true) // before the connection closes: no reconnect registers again
		giveUp(fmt.Errorf("%w: %s", ErrReplaced, p.Reason))
	})
	reg := &RegisterParams{Versions: []int{Version}, PluginVersion: o.Version, Provider: *m}
	cl := k.NewClient(kite.ClientOptions{
		URL:        o.URL,
		MinBackoff: o.MinBackoff,
		MaxBackoff: o.MaxBackoff,
		Auth: func(context.Context) (kite.Auth, error) {
			return kite.Auth{Type: kitekey.KindPluginKey, Key: o.Key}, nil
		},
		OnConnect: func(ctx context.Context, c *kite.Conn) error {
			if replaced.Load() {
				return ErrReplaced
			}
			var res RegisterResult
			if err := c.Call(ctx, MethodRegister, reg, &res); err != nil {
				return fmt.Errorf("%s: %w", MethodRegister, err)
			}
			if res.Version != Version {
				return fmt.Errorf("%w: kloud chose plugin API version %d, this plugin speaks [%d]", errVersion, res.Version, Version)
			}
			log.Info("registered with kloud", "url", o.URL, "kloudVersion", res.KloudVersion, "apiVersion", res.Version)
			return nil
		},
		OnError: func(err error) {
			if permanent(err) {
				giveUp(err)
				return
			}
			log.Warn("cannot reach kloud, trying again", "url", o.URL, "err", err)
		},
	})
	cl.Start()
	defer cl.Close()
	select {
	case <-ctx.Done():
		return nil
	case err := <-fatal:
		if errors.Is(err, ErrReplaced) {
			return fmt.Errorf("plugin %s: %w", p.Name, err)
		}
		return fmt.Errorf("kloud at %s refused plugin %s: %w", o.URL, p.Name, err)
	}
}

var errVersion = errors.New("plugin API version mismatch")

// ErrReplaced is returned by Run when kloud closed the plugin's connection because another
// plugin registered the same provider (the newer registration wins).
var ErrReplaced = errors.New("replaced by a newer registration of the same provider")

// permanent reports whether kloud refused in a way retrying will not cure.
func permanent(err error) bool {
	for _, e := range []error{kite.ErrAuth, kite.ErrPermission, kite.ErrInvalidParams, kite.ErrConflict, errVersion, ErrReplaced} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// ManifestOf is p's manifest as Run registers it.
func ManifestOf(p *provider.Provider) (*Manifest, error) {
	if p == nil || p.Stack == nil || p.Machine == nil {
		return nil, errors.New("plugin: the provider needs a Name, Stack and Machine")
	}
	m := &Manifest{
		Name: p.Name, ResourceType: p.ResourceType, UserDataAttr: p.UserDataAttr, NoCloudInit: p.NoCloudInit,
		Description: p.Description, Capabilities: capsOf(p), Handler: p.Handler != nil,
		Fields: map[string][]provider.Field{}, Constraints: manifestConstraints(p),
	}
	if m.UserDataAttr == "" && !m.NoCloudInit {
		m.UserDataAttr = "user_data"
	}
	for _, tp := range p.TerraformProviders() {
		m.TerraformProviders = append(m.TerraformProviders, TerraformProvider{Name: tp.Name, Source: tp.Source, Types: tp.Types, ProviderArgs: tp.ProviderArgs})
	}
	for part, newFn := range newFuncs(p) {
		if newFn != nil {
			m.Fields[part] = provider.Fields(newFn())
		}
	}
	m.Schemas = map[string]json.RawMessage{}
	for _, part := range parts {
		if s := p.JSONSchema(part); s != nil {
			m.Schemas[part] = s
		}
	}
	if err := ValidateManifest(m); err != nil {
		return nil, fmt.Errorf("plugin: %w", err)
	}
	return m, nil
}

func newFuncs(p *provider.Provider) map[string]func() any {
	return map[string]func() any{
		partCredential: p.Schema.NewCredential,
		partBootstrap:  p.Schema.NewBootstrap,
		partMetadata:   p.Schema.NewMetadata,
	}
}

// capsOf is what p can do: p.Capabilities if set, else derived from what it implements.
func capsOf(p *provider.Provider) []provider.Capability { return p.Caps() }

// server serves kloud's calls on the plugin side: every call builds p's Stack or Machine from
// what kloud sent, as kloud would in process, and calls it.
type server struct {
	p   *provider.Provider
	log *slog.Logger
}

func (s *server) handle(k *kite.Kite) {
	k.Handle(MethodVerifyCredential, kite.Typed(s.verifyCredential))
	k.Handle(MethodBootstrapTemplates, kite.Typed(s.bootstrapTemplates))
	k.Handle(MethodApplyTemplate, kite.Typed(s.applyTemplate))
	k.Handle(MethodValidateConstraints, kite.Typed(s.validateConstraints))
	k.Handle(MethodValidateTemplate, kite.Typed(s.validateTemplate)) // templaterules.go
	k.Handle(MethodDecode, kite.Typed(s.decode))
	k.Handle(MethodAvailable, kite.HandlerFunc(s.available))
	k.Handle(MethodHTTP, kite.Typed(s.http))
	k.Handle(MethodMachineStart, kite.Typed(s.machineStart))
	k.Handle(MethodMachineStop, kite.Typed(s.machineStop))
	k.Handle(MethodMachineInfo, kite.Typed(s.machineInfo))
	k.Handle(MethodMachineConsoleLog, kite.Typed(s.machineConsoleLog))
	k.Handle(MethodMachineResize, kite.Typed(s.machineResize))
	s.handleSnapshots(k) // snapshot.go
	s.handlePorts(k)     // firewall.go
	s.handleResources(k) // resources.go
	s.handleBuckets(k)   // bucket.go
}

// errUnsupported carries provider.ErrUnsupported over the wire: kloud's side turns it back.
var errUnsupported = &kite.Error{Code: kite.CodeState, Message: provider.ErrUnsupported.Error(), Data: &kite.ErrorData{Type: typeUnsupported}}

const typeUnsupported = "unsupported"

// wireErr keeps provider.ErrUnsupported recognizable on the other side.
func wireErr(err error) error {
	if err != nil && errors.Is(err, provider.ErrUnsupported) {
		return fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+provider.ErrUnsupported.Error()), errUnsupported)
	}
	return err
}

func (s *server) credential(w *wireCredential) (*provider.Credential, error) {
	if w == nil {
		return nil, nil
	}
	c := &provider.Credential{ID: w.ID, Title: w.Title, Provider: w.Provider, Team: w.Team}
	var err error
	if c.Value, err = provider.Decode(s.p.Schema.NewCredential, w.Value); err != nil {
		return nil, fmt.Errorf("credential %s does not decode into provider %s's type: %s: %w", w.ID, s.p.Name, err.Error(), kite.ErrInvalidParams)
	}
	if !isNull(w.Bootstrap) {
		if c.Bootstrap, err = provider.Decode(s.p.Schema.NewBootstrap, w.Bootstrap); err != nil {
			return nil, fmt.Errorf("bootstrap outputs of credential %s do not decode into provider %s's type: %s: %w", w.ID, s.p.Name, err.Error(), kite.ErrInvalidParams)
		}
	}
	return c, nil
}

func (s *server) stack(p *stackParams) (provider.Stack, *provider.BaseStack, *provider.Credential, error) {
	cred, err := s.credential(p.Credential)
	if err != nil {
		return nil, nil, nil, err
	}
	w := p.Stack
	b := &provider.BaseStack{Provider: s.p, StackID: w.StackID, Team: w.Team, Owner: w.Owner, Template: w.Template.template(),
		Log: s.log.With("stack", w.StackID), Vacating: w.Vacating}
	for _, m := range w.Machines {
		b.Machines = append(b.Machines, m.spec())
	}
	configs := w.AgentConfigs
	b.AgentConfig = func(_ context.Context, m *provider.MachineSpec) (userdata.Config, error) {
		c, ok := configs[m.ID]
		if !ok {
			return userdata.Config{}, fmt.Errorf("machine %s: kloud sent no agent configuration for it (only machines of this provider in this stack have one)", m.Label)
		}
		return c.config(), nil
	}
	st, err := s.p.Stack(b)
	if err != nil {
		return nil, nil, nil, err
	}
	return st, b, cred, nil
}

func (s *server) verifyCredential(ctx context.Context, _ *kite.Request, p *stackParams) (any, error) {
	st, _, c, err := s.stack(p)
	if err != nil {
		return nil, err
	}
	return nil, wireErr(st.VerifyCredential(ctx, c))
}

func (s *server) bootstrapTemplates(ctx context.Context, _ *kite.Request, p *stackParams) (any, error) {
	st, _, c, err := s.stack(p)
	if err != nil {
		return nil, err
	}
	ts, err := st.BootstrapTemplates(ctx, c)
	if err != nil {
		return nil, wireErr(err)
	}
	res := templatesResult{Templates: []wireTemplate{}}
	for _, t := range ts {
		if t != nil {
			res.Templates = append(res.Templates, *toWireTemplate(t))
		}
	}
	return res, nil
}

func (s *server) applyTemplate(ctx context.Context, _ *kite.Request, p *stackParams) (any, error) {
	if p.Stack.Template == nil {
		return nil, fmt.Errorf("stack.template is required: %w", kite.ErrInvalidParams)
	}
	st, _, c, err := s.stack(p)
	if err != nil {
		return nil, err
	}
	t, err := st.ApplyTemplate(ctx, c)
	if err != nil {
		return nil, wireErr(err)
	}
	if t == nil {
		return nil, fmt.Errorf("provider %s: ApplyTemplate returned no template", s.p.Name)
	}
	return templateResult{Template: *toWireTemplate(t)}, nil
}

func (s *server) validateConstraints(ctx context.Context, _ *kite.Request, p *stackParams) (any, error) {
	st, _, _, err := s.stack(p)
	if err != nil {
		return nil, err
	}
	cv, ok := st.(provider.ConstraintsValidator)
	if !ok {
		return nil, wireErr(fmt.Errorf("validate constraints: %w", provider.ErrUnsupported))
	}
	return nil, wireErr(constraintErr(cv.ValidateConstraints(ctx, p.Attributes)))
}

func (s *server) decode(ctx context.Context, _ *kite.Request, p *decodeParams) (any, error) {
	// The provider's own decode: schema validation, its types (defaults, Valid), and for an
	// update the immutable fields and ValidUpdate.
	v, err := s.p.DecodePart(ctx, p.Part, p.Raw, p.Old)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", p.Part, err.Error(), kite.ErrInvalidParams)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s: encode: %w", p.Part, err)
	}
	return decodeResult{Value: b}, nil
}

func (s *server) available(context.Context, *kite.Request) (any, error) {
	if s.p.Available != nil {
		if err := s.p.Available(); err != nil {
			return availableResult{Unavailable: err.Error()}, nil
		}
	}
	return availableResult{}, nil
}

func (s *server) http(ctx context.Context, _ *kite.Request, p *httpParams) (any, error) {
	if s.p.Handler == nil {
		return nil, wireErr(fmt.Errorf("provider %s has no HTTP service: %w", s.p.Name, provider.ErrUnsupported))
	}
	u, err := url.ParseRequestURI(p.URL)
	if err != nil {
		return nil, fmt.Errorf("url: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	req, err := http.NewRequestWithContext(ctx, p.Method, p.URL, bytes.NewReader(p.Body))
	if err != nil {
		return nil, fmt.Errorf("request: %s: %w", err.Error(), kite.ErrInvalidParams)
	}
	req.URL, req.RequestURI, req.Host, req.RemoteAddr = u, p.URL, p.Host, p.RemoteAddr
	req.Header = p.Header
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.ContentLength = int64(len(p.Body))
	rec := &recorder{header: http.Header{}}
	s.p.Handler.ServeHTTP(rec, req)
	if rec.over {
		return nil, fmt.Errorf("provider %s's HTTP response to %s %s is larger than %d bytes", s.p.Name, p.Method, u.Path, MaxHTTPBody)
	}
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return httpResult{Status: rec.status, Header: rec.header, Body: rec.body.Bytes()}, nil
}

// recorder is the ResponseWriter a plugin's Handler writes to; kloud replays it.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	over   bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.body.Len()+len(b) > MaxHTTPBody {
		r.over = true
		return 0, io.ErrShortWrite
	}
	return r.body.Write(b)
}

func (s *server) machine(w *wireMachine) (provider.Machine, error) {
	cred, err := s.credential(w.Credential)
	if err != nil {
		return nil, err
	}
	b := &provider.BaseMachine{ID: w.ID, Label: w.Label, StackID: w.StackID, Provider: s.p, KiteID: w.KiteID, Owner: w.Owner,
		Attributes: w.Attributes, Meta: w.Meta, Credential: cred, Log: s.log.With("machine", w.ID)}
	return s.p.Machine(b)
}

func encodeMeta(meta any) (json.RawMessage, error) {
	if meta == nil {
		return nil, nil
	}
	if v := reflect.ValueOf(meta); (v.Kind() == reflect.Pointer || v.Kind() == reflect.Map) && v.IsNil() {
		return nil, nil
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("encode machine metadata: %w", err)
	}
	return b, nil
}

func (s *server) power(ctx context.Context, p *machineParams, stop bool) (any, error) {
	m, err := s.machine(&p.Machine)
	if err != nil {
		return nil, err
	}
	var meta any
	if stop {
		meta, err = m.Stop(ctx)
	} else {
		meta, err = m.Start(ctx)
	}
	if err != nil {
		return nil, wireErr(err)
	}
	b, err := encodeMeta(meta)
	return metaResult{Meta: b}, err
}

func (s *server) machineStart(ctx context.Context, _ *kite.Request, p *machineParams) (any, error) {
	return s.power(ctx, p, false)
}

func (s *server) machineStop(ctx context.Context, _ *kite.Request, p *machineParams) (any, error) {
	return s.power(ctx, p, true)
}

func (s *server) machineInfo(ctx context.Context, _ *kite.Request, p *machineParams) (any, error) {
	m, err := s.machine(&p.Machine)
	if err != nil {
		return nil, err
	}
	st, meta, err := m.Info(ctx)
	if err != nil {
		return nil, wireErr(err)
	}
	b, err := encodeMeta(meta)
	return infoResult{State: st, Meta: b}, err
}

func (s *server) machineConsoleLog(ctx context.Context, _ *kite.Request, p *machineParams) (any, error) {
	m, err := s.machine(&p.Machine)
	if err != nil {
		return nil, err
	}
	cl, ok := m.(provider.ConsoleLogger)
	if !ok {
		return nil, wireErr(fmt.Errorf("console log: %w", provider.ErrUnsupported))
	}
	log, err := cl.ConsoleLog(ctx)
	if err != nil {
		return nil, wireErr(err)
	}
	return consoleLogResult{Log: log}, nil
}

func (s *server) machineResize(ctx context.Context, _ *kite.Request, p *machineParams) (any, error) {
	m, err := s.machine(&p.Machine)
	if err != nil {
		return nil, err
	}
	rs, ok := m.(provider.Resizer)
	if !ok {
		return nil, wireErr(fmt.Errorf("resize: %w", provider.ErrUnsupported))
	}
	meta, err := rs.Resize(ctx, p.MemoryMB, p.CPUs)
	if err != nil {
		return nil, wireErr(err)
	}
	b, err := encodeMeta(meta)
	return metaResult{Meta: b}, err
}
